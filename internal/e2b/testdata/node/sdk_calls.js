// Documented calls of E2B's JavaScript SDKs (e2b, @e2b/code-interpreter), against
// roched's E2B listener. Only E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY are set.
// Prints one "ok NAME" line per check and exits non-zero at the first failure.
import { Sandbox, CommandExitError, NotFoundError } from 'e2b'
import { Sandbox as CodeSandbox } from '@e2b/code-interpreter'
import { randomUUID } from 'node:crypto'

function check(cond, name, detail) {
  if (!cond) {
    console.log('FAIL', name, detail === undefined ? '' : JSON.stringify(detail))
    process.exit(1)
  }
  console.log('ok', name)
}

// endsIn checks that sb ends secs seconds from now, within a margin of 60 s.
async function endsIn(sb, secs, name) {
  const left = ((await sb.getInfo()).endAt.getTime() - Date.now()) / 1000
  check(left > secs - 60 && left <= secs + 1, name, left)
}

const run = randomUUID() // this run's sandboxes alone match it
const meta = { purpose: 'sdk-calls', run }
const sbx = await Sandbox.create({ timeoutMs: 600_000, metadata: meta })
let killed
try {
  check(await sbx.isRunning(), 'isRunning')
  const info = await sbx.getInfo()
  check(info.sandboxId === sbx.sandboxId && info.templateId === 'base', 'getInfo', info)
  check(JSON.stringify(info.metadata) === JSON.stringify(meta), 'metadata round trip', info.metadata)
  try {
    await Sandbox.create({ metadata: { 'bad key!': 'x' } })
    check(false, 'a key Roche cannot keep is refused')
  } catch (e) {
    check(String(e).includes('bad key!') && String(e).includes('400'), "metadata key refused in E2B's error shape", String(e))
  }

  let r = await sbx.commands.run('echo out; echo err >&2')
  check(r.stdout === 'out\n' && r.stderr === 'err\n' && r.exitCode === 0, 'commands.run', r)
  try {
    await sbx.commands.run('exit 3')
    check(false, 'exit 3 throws')
  } catch (e) {
    check(e instanceof CommandExitError && e.exitCode === 3, 'CommandExitError', String(e))
  }
  r = await sbx.commands.run('echo $FOO; pwd', { envs: { FOO: 'bar' }, cwd: '/tmp' })
  check(r.stdout === 'bar\n/tmp\n', 'commands.run envs cwd', r.stdout)

  const seen = []
  r = await sbx.commands.run('for i in 1 2 3; do echo tick$i; sleep 0.2; done', { onStdout: (d) => seen.push(d) })
  check(seen.join('').includes('tick3'), 'onStdout', seen)
  const h = await sbx.commands.run('sleep 600', { background: true })
  check((await sbx.commands.list()).some((p) => p.pid === h.pid), 'commands.list')
  const h2 = await sbx.commands.connect(h.pid)
  check(h2.pid === h.pid, 'commands.connect')
  check(await sbx.commands.kill(h.pid), 'commands.kill')
  try {
    await h2.wait()
    check(false, 'killed command throws')
  } catch (e) {
    check(e instanceof CommandExitError, 'killed command ends', String(e))
  }
  const cat = await sbx.commands.run('cat', { background: true, stdin: true })
  await sbx.commands.sendStdin(cat.pid, 'hello stdin\n')
  await sbx.commands.closeStdin(cat.pid)
  r = await cat.wait()
  check(r.stdout === 'hello stdin\n', 'sendStdin closeStdin', r.stdout)

  const base = '/tmp/e2b-files'
  check(await sbx.files.makeDir(base), 'files.makeDir')
  check(!(await sbx.files.makeDir(base)), 'files.makeDir exists -> false')
  const w = await sbx.files.write(base + '/a.txt', 'alpha')
  check(w.path === base + '/a.txt', 'files.write', w)
  check((await sbx.files.read(base + '/a.txt')) === 'alpha', 'files.read')
  const bytes = await sbx.files.read(base + '/a.txt', { format: 'bytes' })
  check(Buffer.from(bytes).toString() === 'alpha', 'files.read bytes')
  await sbx.files.write([{ path: base + '/b.bin', data: new Uint8Array([0, 1, 2]).buffer }, { path: base + '/c.txt', data: 'gamma' }])
  const names = (await sbx.files.list(base)).map((e) => e.name).sort()
  check(JSON.stringify(names) === JSON.stringify(['a.txt', 'b.bin', 'c.txt']), 'files.list write many', names)
  check((await sbx.files.exists(base + '/a.txt')) && !(await sbx.files.exists(base + '/nope')), 'files.exists')
  const moved = await sbx.files.rename(base + '/a.txt', base + '/d.txt')
  check(moved.path === base + '/d.txt', 'files.rename', moved)
  const st = await sbx.files.getInfo(base + '/d.txt')
  check(st.size === 5 && st.type === 'file', 'files.getInfo', st)
  await sbx.files.remove(base + '/d.txt')
  check(!(await sbx.files.exists(base + '/d.txt')), 'files.remove')
  try {
    await sbx.files.read(base + '/d.txt')
    check(false, 'read of a removed file throws')
  } catch (e) {
    check(e instanceof NotFoundError, 'files.read NotFound', String(e))
  }

  const events = []
  let resolveSeen
  const seenW = new Promise((res) => (resolveSeen = res))
  const watcher = await sbx.files.watchDir(base, (ev) => {
    events.push(ev)
    if (ev.name === 'w.txt') resolveSeen()
  })
  await sbx.files.write(base + '/w.txt', 'watched')
  let timer
  const timeout = new Promise((res) => (timer = setTimeout(res, 20_000)))
  await Promise.race([seenW, timeout])
  clearTimeout(timer) // else it holds the process open its 20 s after the script's end
  await watcher.stop()
  check(events.some((e) => e.name === 'w.txt'), 'files.watchDir', events)

  const page = await Sandbox.list().nextItems()
  check(page.some((s) => s.sandboxId === sbx.sandboxId), 'Sandbox.list')
  const again = await Sandbox.connect(sbx.sandboxId)
  check((await again.commands.run('echo again')).stdout === 'again\n', 'Sandbox.connect')

  // the metadata filter: this run's sandbox alone, every pair must match
  let got = (await Sandbox.list({ query: { metadata: { run } } }).nextItems()).map((s) => s.sandboxId)
  check(JSON.stringify(got) === JSON.stringify([sbx.sandboxId]), 'Sandbox.list metadata filter', got)
  got = await Sandbox.list({ query: { metadata: { run, purpose: 'other' } } }).nextItems()
  check(got.length === 0, 'Sandbox.list metadata filter, a pair not matching', got)

  // setTimeout: both sandboxes to end in 3 s, then this one extended; the short one
  // ends, this one survives it. Where the provider cannot extend a sandbox beyond the
  // lifetime it was made with (noextend: kubernetes), only the short one is shortened, and
  // extending this one is refused in E2B's error shape.
  const noextend = process.argv.includes('noextend')
  const short = await Sandbox.create({ timeoutMs: 600_000, metadata: { run } })
  await short.setTimeout(3_000)
  await endsIn(short, 3, 'setTimeout shortens')
  if (noextend) {
    try {
      await sbx.setTimeout(900_000)
      check(false, 'setTimeout beyond the lifetime made with throws')
    } catch (e) {
      check(String(e).includes('501'), "setTimeout beyond the lifetime made with refused in E2B's error shape", String(e))
    }
  } else {
    await sbx.setTimeout(3_000)
    await sbx.setTimeout(900_000)
    await endsIn(sbx, 900, 'setTimeout extends')
  }
  const deadline = Date.now() + 90_000
  while ((await short.isRunning()) && Date.now() < deadline) await new Promise((res) => setTimeout(res, 500))
  check(!(await short.isRunning()), 'setTimeout: the sandbox ends at its new timeout')
  check((await sbx.isRunning()) && (await sbx.commands.run('echo alive')).stdout === 'alive\n', 'setTimeout: the other sandbox survives')
  got = (await Sandbox.list({ query: { metadata: { run } } }).nextItems()).map((s) => s.sandboxId)
  check(JSON.stringify(got) === JSON.stringify([sbx.sandboxId]), 'the ended sandbox is gone from the list', got)
  if (!noextend) {
    await Sandbox.connect(sbx.sandboxId, { timeoutMs: 1_200_000 })
    await endsIn(sbx, 1200, 'connect with timeout extends')
  }
} finally {
  killed = await sbx.kill()
}
check(killed === undefined || killed === true, 'kill')
check((await Sandbox.kill(sbx.sandboxId)) === false, 'kill of a killed sandbox -> false')
try {
  await Sandbox.connect(sbx.sandboxId)
  check(false, 'connect to a killed sandbox throws')
} catch (e) {
  check(e instanceof NotFoundError, 'killed sandbox NotFound', String(e))
}

const cs = await CodeSandbox.create()
try {
  await cs.runCode('x = 1')
  let ex = await cs.runCode('x += 1; x')
  check(ex.text === '2', 'runCode state', ex.text)
  ex = await cs.runCode("print('hi')")
  check(JSON.stringify(ex.logs.stdout) === '["hi\\n"]', 'runCode stdout', ex.logs)
  ex = await cs.runCode('1/0')
  check(ex.error && ex.error.name === 'ZeroDivisionError' && ex.error.traceback.includes('ZeroDivision'), 'runCode error traceback', ex.error)
  ex = await cs.runCode('import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()')
  check(ex.results.some((r) => r.png && r.png.startsWith('iVBOR')), 'runCode matplotlib png')
  const ctx = await cs.createCodeContext()
  await cs.runCode('y = 41', { context: ctx })
  check((await cs.runCode('y + 1', { context: ctx })).text === '42', 'context state')
  ex = await cs.runCode('y')
  check(ex.error && ex.error.name === 'NameError', 'contexts are separate', ex.error)
  check((await cs.listCodeContexts()).some((c) => c.id === ctx.id), 'listCodeContexts')
  await cs.restartCodeContext(ctx)
  check((await cs.runCode("'y' in dir()", { context: ctx })).text === 'False', 'restartCodeContext')
  await cs.removeCodeContext(ctx)
  check(!(await cs.listCodeContexts()).some((c) => c.id === ctx.id), 'removeCodeContext')
} finally {
  await cs.kill()
}
console.log('all ok')
