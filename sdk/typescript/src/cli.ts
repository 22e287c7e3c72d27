// The roche CLI as a transport: `roche --direct ... --json` as a subprocess per call, a streamed
// `roche exec` for execStream, `roche cp` for files, and for a leased sandbox the
// `roche create --hold` process that made it, which holds it until its stdin closes.

import { spawn, type ChildProcess } from "node:child_process";
import { chmod, mkdtemp, readFile, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { CodeEventParser, type CodeItem, type CodeRequest, type Context } from "./code.js";
import { Deadline } from "./deadline.js";
import { errorFor, InvalidConfig, PermissionDenied, ProviderUnavailable, reasonFromText, RocheError, SandboxNotFound } from "./errors.js";
import {
  egressDecision,
  type EgressDecision,
  execResult,
  mountString,
  OutputAssembler,
  type EndReason,
  type ExecRequest,
  type ExecResult,
  type ListOptions,
  type OutputEvent,
  type Receipt,
  type SandboxConfig,
  type SandboxInfo,
  storedSecret,
  type StoredSecret,
} from "./types.js";
import type { StreamItem, Transport } from "./transport.js";
import { entryFromCLI, eventFromCLI, IdleTimer, type EntryInfo, type FilesystemEvent } from "./files.js";
import {
  cliEvent,
  closeArgs,
  connectArgs,
  listArgs,
  parseCLICommand,
  sendArgs,
  signalArgs,
  startArgs,
  type CommandEvent,
  type CommandInfo,
  type CommandRequest,
  type CommandSelector,
} from "./commands.js";

/** The CLI's exit statuses besides the command's own (internal/cli). */
const EXIT_TIMEOUT = 124;
const EXIT_ROCHE_FAILED = 125;
/** The exit code of a command killed at its timeout, as every provider reports it. */
const EXIT_KILLED = 137;
/** How long undoing a half-done call, or letting go at close(), may take. */
const UNDO_TIMEOUT = 20;

export function createArgs(provider: string, cfg: SandboxConfig): string[] {
  const a = ["create", "--json", "--provider", provider, "--image", cfg.image, "--memory", cfg.memory, "--disk", cfg.disk,
    "--cpus", String(cfg.cpus), "--timeout", String(cfg.timeoutSecs), "--pids-limit", String(cfg.pidsLimit)];
  if (cfg.network) a.push("--network");
  if (cfg.writable) a.push("--writable");
  for (const [k, v] of Object.entries(cfg.env)) a.push("--env", `${k}=${v}`);
  for (const m of cfg.mounts) a.push("--mount", mountString(m));
  if (cfg.workdir) a.push("--workdir", cfg.workdir);
  if (cfg.user) a.push("--user", cfg.user);
  for (const h of cfg.networkAllowlist) a.push("--allow-host", h);
  if (cfg.workspace) a.push("--workspace", cfg.workspace);
  if (cfg.fromSnapshot) a.push("--from-snapshot", cfg.fromSnapshot);
  if (cfg.workspaceSize !== undefined) a.push("--workspace-size", cfg.workspaceSize);
  for (const [k, v] of Object.entries(cfg.metadata)) a.push("--metadata", `${k}=${v}`);
  for (const sec of cfg.secrets) {
    // Never a value on a command line: the CLI takes one from a file only.
    if (!sec.fromStore) throw new InvalidConfig(`secret ${sec.name}: a secret with a value needs roched (the daemon transport)`);
    a.push("--secret", sec.name);
    for (const h of sec.hosts) a.push("--secret-host", `${sec.name}=${h}`);
    if (sec.header) a.push("--secret-header", `${sec.name}=${sec.header}`);
  }
  if (cfg.egressLearn) a.push("--egress-learn");
  if (cfg.leased) a.push("--hold"); // roche stays, holding the sandbox until its stdin closes (CLIHold)
  return a;
}

export function execArgs(sid: string, req: ExecRequest, asJSON: boolean): string[] {
  const a = ["exec", "--sandbox", sid];
  if (asJSON) a.push("--json");
  if (req.timeout) a.push("--timeout", String(req.timeout));
  if (req.stdin !== undefined) a.push("--interactive");
  for (const [k, v] of Object.entries(req.env)) a.push("--env", `${k}=${v}`);
  if (req.workdir) a.push("--workdir", req.workdir);
  if (req.idempotencyKey !== undefined) a.push("--idempotency-key", req.idempotencyKey);
  return [...a, "--", ...req.cmd];
}

/** `roche code --json-events`, the code on standard input. */
export function codeArgs(sid: string, req: CodeRequest): string[] {
  const a = ["code", "--sandbox", sid, "--json-events"];
  if (req.language) a.push("--language", req.language);
  if (req.context) a.push("--context", req.context);
  if (req.timeout) a.push("--timeout", String(req.timeout));
  return a;
}

function time(v: unknown): Date | undefined {
  return typeof v === "string" && v ? new Date(v) : undefined;
}

/** A sandbox as `roche create --json` and `roche list --json` print it. */
export function parseInfo(o: unknown): SandboxInfo {
  if (!o || typeof o !== "object") throw new RocheError(`the roche CLI printed ${JSON.stringify(o)} where a sandbox was expected`);
  const m = o as Record<string, unknown>;
  return {
    id: String(m.id ?? ""),
    provider: String(m.provider ?? ""),
    image: String(m.image ?? ""),
    state: String(m.state ?? ""),
    createdAt: time(m.created_at),
    expiresAt: time(m.expires_at),
    owner: String(m.owner ?? ""),
    metadata: Object.fromEntries(Object.entries((m.metadata as Record<string, unknown>) ?? {}).map(([k, v]) => [k, String(v)])),
    end: parseEnd(m.end),
  };
}

/** Why a sandbox ended, as `roche inspect --json` prints it under "end". */
function parseEnd(o: unknown): EndReason | undefined {
  if (!o || typeof o !== "object") return undefined;
  const m = o as Record<string, unknown>;
  return {
    kind: String(m.kind ?? "unknown"),
    at: time(m.at),
    detail: String(m.detail ?? ""),
    evidence: String(m.evidence ?? ""),
    by: String(m.by ?? ""),
    exitCode: m.exit_known ? Number(m.exit_code ?? 0) : undefined,
  };
}

/** A command's receipt as `roche exec --json` prints it. */
function parseReceipt(o: unknown): Receipt | undefined {
  if (!o || typeof o !== "object") return undefined;
  const m = o as Record<string, unknown>;
  return {
    peakMemoryBytes: Number(m.peak_memory_bytes ?? 0),
    cpuTime: Number(m.cpu_time_ns ?? 0) / 1e9,
    leftoverProcesses: Number(m.leftover_processes ?? 0),
    end: String(m.end ?? ""),
    evidence: String(m.evidence ?? ""),
  };
}

export function parseJSON(out: Buffer | string, what: string): unknown {
  try {
    return JSON.parse(out.toString());
  } catch {
    throw new RocheError(`the roche CLI printed no JSON for ${what}: ${JSON.stringify(out.toString().slice(0, 200))}`);
  }
}

/** A result as `roche exec --json` prints it. */
export function parseExec(o: unknown): ExecResult {
  if (!o || typeof o !== "object") throw new RocheError(`the roche CLI printed ${JSON.stringify(o)} where an exec result was expected`);
  const m = o as Record<string, unknown>;
  return execResult({
    stdout: String(m.stdout ?? ""),
    stderr: String(m.stderr ?? ""),
    exitCode: Number(m.exit_code ?? 0),
    timedOut: Boolean(m.timed_out),
    truncated: Boolean(m.truncated),
    oomKilled: Boolean(m.oom_killed),
    duration: Number(m.duration_ns ?? 0) / 1e9,
    receipt: parseReceipt(m.receipt),
  });
}

/** The typed error for what the CLI printed on stderr: its JSON error object
 * (`{"error": {"reason", "message", "retry_after_ms"}}`, with --json), else its one-line
 * `roche: MESSAGE`. */
export function errorFromStderr(stderr: Buffer | string, rc: number | null, verb: string): RocheError {
  const lines = stderr.toString().split("\n").filter((l) => l.trim() !== "");
  for (let i = lines.length - 1; i >= 0; i--) {
    const line = lines[i].trim();
    if (line.startsWith("{")) {
      try {
        const e = (JSON.parse(line) as { error?: { reason?: unknown; message?: unknown; retry_after_ms?: unknown } }).error;
        if (e && typeof e.message === "string") {
          const after = typeof e.retry_after_ms === "number" ? e.retry_after_ms / 1000 : undefined;
          return errorFor(typeof e.reason === "string" ? e.reason : "", e.message, after);
        }
      } catch {
        // not the CLI's error object: the command's own output
      }
    }
    if (line.startsWith("roche: ")) {
      // "(see --help)" is for people at a terminal, not for SDK users.
      const message = line.slice("roche: ".length).replace(/ \(see --help\)$/, "");
      return errorFor(reasonFromText(message), message);
    }
  }
  return new RocheError(`roche ${verb} exited with status ${rc}: ${lines.slice(-3).join(" | ") || "no message"}`);
}

const PREFIX = Buffer.from("roche: ");
const TRUNCATED = /^roche: output truncated: a stream passed \d+ bytes$/;
const OOM = /^roche: the command was killed for exceeding the sandbox's memory limit \(raise it with --memory\)$/;
// The CLI names the limit that killed it (internal/cli's timedOut): the command's own
// timeout, or the sandbox's lifetime.
const TIMED_OUT =
  /^roche: the command (timed out: \S+ \S+ killed it after it ran \S+|was killed when the sandbox's lifetime ended \(.*\))$/;

function qualifies(line: Buffer, complete: boolean): boolean {
  if (line.subarray(0, PREFIX.length).equals(PREFIX)) return true;
  return !complete && PREFIX.subarray(0, line.length).equals(line);
}

/** Where the suffix of buf made only of lines that may be roche's own begins. */
function heldSuffix(buf: Buffer, atLineStart: boolean): number {
  let cut = buf.length;
  while (cut > 0) {
    const start = cut >= 2 ? buf.lastIndexOf(0x0a, cut - 2) + 1 : 0;
    if (start === 0 && !atLineStart) break;
    const line = buf.subarray(start, cut);
    if (!qualifies(line, line[line.length - 1] === 0x0a)) break;
    cut = start;
  }
  return cut;
}

/** Reads a streaming `roche exec`: stdout and stderr pieces become events as they come,
 * except stderr lines that start with "roche: ", held back until it is clear whether they are
 * the command's or roche's closing lines (truncated, OOM killed, timed out, or an error). */
export class StreamParser {
  readonly out = new OutputAssembler();
  private held = Buffer.alloc(0);
  private atLineStart = true;

  feed(stream: "stdout" | "stderr", data: Buffer): OutputEvent[] {
    if (data.length === 0) return [];
    if (stream === "stdout") return [this.out.output("stdout", data)];
    const buf = Buffer.concat([this.held, data]);
    const cut = heldSuffix(buf, this.atLineStart);
    const emit = buf.subarray(0, cut);
    this.held = Buffer.from(buf.subarray(cut));
    if (emit.length) {
      this.atLineStart = emit[emit.length - 1] === 0x0a;
      return [this.out.output("stderr", Buffer.from(emit))];
    }
    return [];
  }

  finish(rc: number, duration: number): [OutputEvent[], ExecResult] {
    const text = this.held.toString("utf8");
    const lines = text.split(/(?<=\n)/).filter((l) => l !== "");
    const last = lines[lines.length - 1];
    if (rc === EXIT_ROCHE_FAILED && last?.startsWith("roche: ") && last.endsWith("\n")) {
      const bare = last.slice(0, -1);
      if (!(TRUNCATED.test(bare) || OOM.test(bare) || TIMED_OUT.test(bare))) throw errorFromStderr(bare, rc, "exec");
    }
    let truncated = false, oom = false, timedOut = false;
    let rest = "";
    for (const line of lines) {
      const bare = line.replace(/\n$/, "");
      if (TRUNCATED.test(bare)) truncated = true;
      else if (OOM.test(bare)) oom = true;
      else if (rc === EXIT_TIMEOUT && TIMED_OUT.test(bare)) timedOut = true;
      else rest += line;
    }
    const events = rest ? [this.out.output("stderr", Buffer.from(rest))] : [];
    const result = this.out.result({ exitCode: timedOut ? EXIT_KILLED : rc, timedOut, truncated, oomKilled: oom, duration });
    return [events, result];
  }
}

/** Ends a CLI process: SIGTERM first, so that it cleans up (kills the command it runs,
 * destroys a half-made sandbox), then SIGKILL after 10 s. */
function stop(p: ChildProcess): Promise<void> {
  if (p.exitCode !== null || p.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => {
    const t = setTimeout(() => p.kill("SIGKILL"), 10_000);
    p.once("close", () => {
      clearTimeout(t);
      resolve();
    });
    p.kill("SIGTERM");
  });
}

function exited(p: ChildProcess): Promise<number> {
  return new Promise((resolve) => {
    if (p.exitCode !== null) resolve(p.exitCode);
    else if (p.signalCode !== null) resolve(128 + 9);
    else p.once("close", (code, sig) => resolve(code ?? (sig ? 128 + 9 : 0)));
  });
}

/** `roche --direct create --hold --json ...`: the roche process that made the sandbox keeps
 * it, and its lease, until its stdin closes, and destroys it then. The pipe closes when this
 * process ends, however it ends. Neither the process nor its pipes keep Node running. */
class CLIHold {
  readonly p: ChildProcess;
  private stderr: Buffer[] = [];
  private exit: Promise<number>;
  constructor(cli: string, args: string[]) {
    // A session of its own: Ctrl-C at a terminal interrupts this program (which then destroys
    // what it wants gone), not the process holding its sandboxes.
    this.p = spawn(cli, ["--direct", ...args], { stdio: ["pipe", "pipe", "pipe"], detached: true });
    this.p.stderr!.on("data", (b: Buffer) => {
      this.stderr.push(b);
      if (this.stderr.length > 64) this.stderr.shift();
    });
    this.exit = exited(this.p);
  }

  get ended(): boolean {
    return this.p.exitCode !== null || this.p.signalCode !== null;
  }

  /** The sandbox, once roche has made it (and holds it); its error otherwise. */
  async first(d: Deadline, cli: string): Promise<SandboxInfo> {
    const spawned = new Promise<never>((_, reject) =>
      this.p.once("error", (e) => reject(new ProviderUnavailable(`cannot run the roche CLI ${JSON.stringify(cli)}: ${e.message}: put roche on PATH or set ROCHE_CLI`))));
    let buf = "";
    const line = new Promise<string | undefined>((resolve) => {
      const onData = (b: Buffer) => {
        buf += b.toString("utf8");
        const nl = buf.indexOf("\n");
        if (nl >= 0) {
          this.p.stdout!.off("data", onData);
          resolve(buf.slice(0, nl));
        }
      };
      this.p.stdout!.on("data", onData);
      this.p.stdout!.once("end", () => resolve(undefined));
    });
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, reject) => {
      const left = d.remainingMs();
      if (left !== undefined) timer = setTimeout(() => reject(d.expired("roche create")), Math.max(0, left));
    });
    try {
      const got = await Promise.race([line, spawned, timeout]);
      if (got === undefined) {
        const rc = await this.exit;
        throw errorFromStderr(Buffer.concat(this.stderr), rc, "create");
      }
      const info = parseInfo(parseJSON(got, "create --hold"));
      this.detach();
      return info;
    } catch (e) {
      await stop(this.p); // SIGTERM: roche undoes a create in progress, destroys a sandbox made
      throw e;
    } finally {
      clearTimeout(timer);
    }
  }

  /** From now on the holding process and its pipes must not keep Node running. */
  private detach(): void {
    this.p.stdout!.resume();
    for (const s of [this.p.stdin, this.p.stdout, this.p.stderr]) (s as unknown as { unref?: () => void })?.unref?.();
    this.p.unref();
  }

  /** Closes roche's stdin: it destroys the sandbox and exits. */
  release(): void {
    this.p.stdin?.end();
  }

  /** Lets go, and waits within d for roche to have destroyed the sandbox: its exit status,
   * or undefined when it has not exited in time. */
  async finish(d: Deadline): Promise<number | undefined> {
    this.release();
    this.p.ref();
    let timer: NodeJS.Timeout | undefined;
    try {
      return await Promise.race([
        this.exit,
        new Promise<undefined>((r) => (timer = setTimeout(() => r(undefined), Math.max(0, d.remainingMs() ?? 2 ** 31 - 1)))),
      ]);
    } finally {
      clearTimeout(timer);
    }
  }

  stop(): Promise<void> {
    return stop(this.p);
  }
}

interface Ran {
  out: Buffer;
  err: Buffer;
  rc: number;
}

export class CLITransport implements Transport {
  readonly name = "cli" as const;
  private holds = new Map<string, CLIHold>();

  constructor(readonly cli: string) {}

  private unavailable(e: Error): ProviderUnavailable {
    return new ProviderUnavailable(`cannot run the roche CLI ${JSON.stringify(this.cli)}: ${e.message}: put roche on PATH or set ROCHE_CLI`);
  }

  /** `roche --direct ARGS`; without --direct when not direct (a command only roched serves). */
  private spawn(args: string[], stdin: boolean, direct = true): ChildProcess {
    return spawn(this.cli, [...(direct ? ["--direct"] : []), ...args], { stdio: [stdin ? "pipe" : "ignore", "pipe", "pipe"] });
  }

  private run(args: string[], d: Deadline, stdin?: Uint8Array, signal?: AbortSignal, direct = true): Promise<Ran> {
    return new Promise((resolve, reject) => {
      const p = this.spawn(args, stdin !== undefined, direct);
      const out: Buffer[] = [];
      const err: Buffer[] = [];
      let failed: unknown;
      p.stdout!.on("data", (b: Buffer) => out.push(b));
      p.stderr!.on("data", (b: Buffer) => err.push(b));
      p.on("error", (e) => {
        failed = this.unavailable(e);
      });
      if (stdin !== undefined) {
        p.stdin!.on("error", () => undefined); // it exited before reading all of it
        p.stdin!.end(stdin);
      }
      const s = d.signal(signal);
      s.signal.addEventListener("abort", () => {
        failed = s.timedOut() ? d.expired(`roche ${args[0]}`) : signal?.reason;
        void stop(p);
      }, { once: true });
      p.on("close", (code, sig) => {
        s.dispose();
        if (failed !== undefined) reject(failed);
        else resolve({ out: Buffer.concat(out), err: Buffer.concat(err), rc: code ?? (sig ? 137 : 0) });
      });
    });
  }

  private async call(args: string[], d: Deadline): Promise<Buffer> {
    const r = await this.run(args, d);
    if (r.rc !== 0) throw errorFromStderr(r.err, r.rc, args[0]);
    return r.out;
  }

  /** A command only roched serves (the egress proxies, the secret store): the CLI without
   * --direct, which asks the roched on its socket (ROCHE_SOCKET). */
  private async roched(args: string[], d: Deadline, stdin?: Uint8Array): Promise<Buffer> {
    const r = await this.run(args, d, stdin, undefined, false);
    if (r.rc !== 0) throw errorFromStderr(r.err, r.rc, `${args[0]} ${args[1]}`);
    return r.out;
  }

  async create(provider: string, cfg: SandboxConfig, d: Deadline): Promise<SandboxInfo> {
    if (!cfg.leased) return parseInfo(parseJSON(await this.call(createArgs(provider, cfg), d), "create"));
    const h = new CLIHold(this.cli, createArgs(provider, cfg));
    const info = await h.first(d, this.cli);
    for (const [id, old] of this.holds) if (old.ended) this.holds.delete(id);
    this.holds.set(info.id, h);
    return info;
  }

  async exec(sid: string, req: ExecRequest, d: Deadline): Promise<ExecResult> {
    const r = await this.run(execArgs(sid, req, true), d, req.stdin, req.signal);
    if (r.out.toString().trim()) {
      try {
        return parseExec(JSON.parse(r.out.toString()));
      } catch {
        // not a result: the error is on stderr
      }
    }
    throw errorFromStderr(r.err, r.rc, "exec");
  }

  async *execStream(sid: string, req: ExecRequest, d: Deadline): AsyncGenerator<StreamItem> {
    const started = Date.now();
    const p = this.spawn(execArgs(sid, req, false), req.stdin !== undefined);
    const parser = new StreamParser();
    // Events from both pipes, in the order they arrive, through one queue.
    type Item = { stream: "stdout" | "stderr"; data: Buffer } | { end: true } | { error: unknown };
    const queue: Item[] = [];
    let wake: (() => void) | undefined;
    const push = (it: Item) => {
      queue.push(it);
      wake?.();
    };
    p.stdout!.on("data", (b: Buffer) => push({ stream: "stdout", data: b }));
    p.stderr!.on("data", (b: Buffer) => push({ stream: "stderr", data: b }));
    p.on("error", (e) => push({ error: this.unavailable(e) }));
    const exit = exited(p);
    let rc = 0;
    void exit.then((c) => {
      rc = c;
      push({ end: true });
    });
    if (req.stdin !== undefined) {
      p.stdin!.on("error", () => undefined);
      p.stdin!.end(req.stdin);
    }
    const s = d.signal(req.signal);
    s.signal.addEventListener("abort", () => push({ error: s.timedOut() ? d.expired("roche exec") : req.signal?.reason }), { once: true });
    let done = false;
    try {
      for (;;) {
        while (queue.length === 0) await new Promise<void>((r) => (wake = r));
        wake = undefined;
        const it = queue.shift()!;
        if ("error" in it) throw it.error;
        if ("end" in it) break;
        yield* parser.feed(it.stream, it.data);
      }
      const [events, result] = parser.finish(rc, (Date.now() - started) / 1000);
      done = true;
      yield* events;
      yield result;
    } finally {
      s.dispose();
      if (!done) await stop(p); // left early, or failed: the command is killed
    }
  }

  async destroy(sid: string, d: Deadline): Promise<void> {
    const h = this.holds.get(sid);
    this.holds.delete(sid);
    if (h) {
      const rc = await h.finish(d);
      if (rc === undefined) {
        await h.stop();
        throw d.expired("roche destroy");
      }
      if (rc === 0) return;
      // It could not destroy the sandbox (or was stopped): destroy it as usual, for the error.
    }
    try {
      await this.call(["destroy", sid], d);
    } catch (e) {
      if (!(e instanceof SandboxNotFound)) throw e; // destroy is idempotent, as over the daemon
    }
  }

  async inspect(sid: string, d: Deadline): Promise<SandboxInfo> {
    // Every provider but Docker prefixes its ids.
    const m = /^([a-z]+)-/.exec(sid);
    const provider = m && m[1] !== "docker" ? m[1] : "docker";
    for (const sb of await this.list(provider, d)) {
      if (sb.id === sid || (sid.length >= 12 && sb.id.startsWith(sid))) return sb;
    }
    throw new SandboxNotFound(`not found: no sandbox ${sid} among yours (listing your sandboxes shows the live ones)`);
  }

  async inspectEnded(sid: string, d: Deadline): Promise<SandboxInfo> {
    // roche inspect: through roched, ended sandboxes too; directly, live ones only.
    return parseInfo(parseJSON(await this.call(["inspect", "--json", sid], d), "inspect"));
  }

  async list(provider: string, d: Deadline, o: ListOptions = {}): Promise<SandboxInfo[]> {
    const args = ["list", "--json", "--provider", provider];
    for (const [k, v] of Object.entries(o.metadata ?? {})) args.push("--metadata", `${k}=${v}`);
    if (o.state) args.push("--state", o.state);
    const obj = parseJSON(await this.call(args, d), "list");
    return ((obj as unknown[]) ?? []).map(parseInfo);
  }

  async setTimeout(sid: string, timeoutSecs: number, d: Deadline): Promise<SandboxInfo> {
    return parseInfo(parseJSON(await this.call(["set-timeout", "--json", sid, String(timeoutSecs)], d), "set-timeout"));
  }

  async pause(sid: string, pause: boolean, d: Deadline): Promise<void> {
    await this.call([pause ? "pause" : "unpause", sid], d);
  }

  async pauseToDisk(sid: string, d: Deadline): Promise<void> {
    await this.call(["pause", "--to-disk", sid], d);
  }

  async resume(sid: string, d: Deadline): Promise<SandboxInfo> {
    await this.call(["resume", sid], d);
    return this.inspect(sid, d);
  }

  async fork(sid: string, count: number, d: Deadline): Promise<SandboxInfo[]> {
    const out = await this.call(["fork", "-n", String(count), sid], d);
    const ids = out.toString().split("\n").map((l) => l.trim()).filter(Boolean);
    const m = /^([a-z]+)-/.exec(sid);
    const listed = new Map((await this.list(m && m[1] !== "docker" ? m[1] : "docker", d)).map((sb) => [sb.id, sb]));
    const missing = ids.filter((id) => !listed.has(id));
    if (missing.length) throw new RocheError(`roche fork made ${missing.join(", ")}, which roche list does not show`);
    return ids.map((id) => listed.get(id)!);
  }

  async writeFile(sid: string, path: string, data: Uint8Array, mode: number, d: Deadline): Promise<void> {
    const name = path.split("/").filter(Boolean).pop()!;
    const tmp = await mkdtemp(join(tmpdir(), "roche-"));
    try {
      const src = join(tmp, name);
      await writeFile(src, data);
      await chmod(src, mode & 0o7777);
      await this.call(["cp", "--json", "-T", src, `${sid}:${path}`], d);
    } finally {
      await rm(tmp, { recursive: true, force: true });
    }
  }

  async readFile(sid: string, path: string, d: Deadline, maxBytes: number): Promise<Uint8Array> {
    const tmp = await mkdtemp(join(tmpdir(), "roche-"));
    try {
      const dst = join(tmp, "file");
      const out = await this.call(["cp", "--json", "-T", "--max-bytes", String(maxBytes), `${sid}:${path}`, dst], d);
      const report = parseJSON(out, "cp") as { skipped_links?: number };
      const st = await stat(dst).catch(() => undefined);
      if (!st && (report?.skipped_links ?? 0) > 0) {
        throw new PermissionDenied(`permission denied: ${path} is a symlink, which the files API does not follow`);
      }
      if (st?.isDirectory()) throw new InvalidConfig(`invalid config: ${path} is a directory: readFile reads files`);
      return await readFile(dst);
    } finally {
      await rm(tmp, { recursive: true, force: true });
    }
  }

  async *runCode(sid: string, req: CodeRequest, d: Deadline): AsyncGenerator<CodeItem> {
    const p = this.spawn(codeArgs(sid, req), true);
    const parser = new CodeEventParser();
    const err: Buffer[] = [];
    type Item = { data: Buffer } | { end: true } | { error: unknown };
    const queue: Item[] = [];
    let wake: (() => void) | undefined;
    const push = (it: Item) => {
      queue.push(it);
      wake?.();
    };
    p.stdout!.on("data", (b: Buffer) => push({ data: b }));
    p.stderr!.on("data", (b: Buffer) => err.push(b));
    p.on("error", (e) => push({ error: this.unavailable(e) }));
    let rc = 0;
    void exited(p).then((c) => {
      rc = c;
      push({ end: true });
    });
    p.stdin!.on("error", () => undefined);
    p.stdin!.end(Buffer.from(req.code, "utf8"));
    const s = d.signal(req.signal);
    s.signal.addEventListener("abort", () => push({ error: s.timedOut() ? d.expired("roche code") : req.signal?.reason }), { once: true });
    let done = false;
    try {
      for (;;) {
        while (queue.length === 0) await new Promise<void>((r) => (wake = r));
        wake = undefined;
        const it = queue.shift()!;
        if ("error" in it) throw it.error;
        if ("end" in it) break;
        yield* parser.feed(it.data);
      }
      done = true;
      yield* parser.feed(Buffer.from("\n"));
      if (!parser.execution) throw errorFromStderr(Buffer.concat(err), rc, "code");
    } finally {
      s.dispose();
      if (!done) await stop(p); // left early, or failed: the cell is interrupted
    }
  }

  // The files API (sandbox.files), through `roche files`: content streamed through the
  // CLI's standard input and output, with the pipes' own backpressure.

  /** A `roche files` process whose stdout is read as it comes: the pieces, then its exit
   * checked (its error from stderr). */
  private async *filesOutput(args: string[], idle: IdleTimer, stdin?: AsyncIterable<Uint8Array>): AsyncGenerator<Buffer> {
    const p = this.spawn(args, stdin !== undefined);
    const err: Buffer[] = [];
    let failed: unknown;
    p.stderr!.on("data", (b: Buffer) => err.push(b));
    p.on("error", (e) => {
      failed = this.unavailable(e);
    });
    const exit = exited(p);
    const onAbort = () => void stop(p);
    idle.signal.addEventListener("abort", onAbort, { once: true });
    let fed: Promise<void> = Promise.resolve();
    if (stdin !== undefined) {
      const w = p.stdin!;
      w.on("error", () => undefined); // it stopped reading: its exit says why
      fed = (async () => {
        try {
          for await (const piece of stdin) {
            idle.touch();
            if (w.destroyed) return;
            if (!w.write(piece)) {
              await new Promise<void>((resolve) => {
                const go = () => {
                  w.off("drain", go);
                  w.off("close", go);
                  resolve();
                };
                w.on("drain", go);
                w.on("close", go);
              });
            }
          }
        } finally {
          w.end();
        }
      })();
    }
    let done = false;
    try {
      for await (const b of p.stdout! as AsyncIterable<Buffer>) {
        idle.touch();
        yield b;
      }
      const rc = await exit;
      await fed;
      done = true;
      const t = idle.timedOut();
      if (t) throw t;
      if (failed !== undefined) throw failed;
      if (idle.signal.aborted) return; // stopped by its caller
      if (rc !== 0) throw errorFromStderr(Buffer.concat(err), rc, args[0] === "files" ? `files ${args[1]}` : args[0]);
    } finally {
      idle.signal.removeEventListener("abort", onAbort);
      idle.dispose();
      if (!done) await stop(p);
    }
  }

  async *fileRead(sid: string, path: string, maxBytes: number, idleMs: number): AsyncGenerator<EntryInfo | Uint8Array> {
    const args = ["files", "cat", ...(maxBytes ? ["--max-bytes", String(maxBytes)] : []), sid, path];
    yield* this.filesOutput(args, new IdleTimer(idleMs, "roche files cat"));
  }

  async fileWrite(sid: string, path: string, content: AsyncIterable<Uint8Array>, mode: number, maxBytes: number, idleMs: number): Promise<EntryInfo> {
    const args = ["files", "write", "--json", "--mode", mode.toString(8), ...(maxBytes ? ["--max-bytes", String(maxBytes)] : []), sid, path];
    const out: Buffer[] = [];
    for await (const b of this.filesOutput(args, new IdleTimer(idleMs, "roche files write"), content)) out.push(b);
    return entryFromCLI(parseJSON(Buffer.concat(out), "files write"));
  }

  async fileList(sid: string, path: string, depth: number, ms: number): Promise<EntryInfo[]> {
    const out = await this.call(["files", "ls", "--json", "--depth", String(depth), sid, path], new Deadline(ms / 1000));
    return ((parseJSON(out, "files ls") as unknown[]) ?? []).map(entryFromCLI);
  }

  async fileStat(sid: string, path: string, missingOk: boolean, ms: number): Promise<EntryInfo | undefined> {
    const d = new Deadline(ms / 1000);
    if (missingOk && (await this.call(["files", "exists", sid, path], d)).toString().trim() !== "true") return undefined;
    return entryFromCLI(parseJSON(await this.call(["files", "stat", "--json", sid, path], d), "files stat"));
  }

  async fileMkdir(sid: string, path: string, ms: number): Promise<boolean> {
    const out = await this.call(["files", "mkdir", "--json", sid, path], new Deadline(ms / 1000));
    return Boolean((parseJSON(out, "files mkdir") as { created?: boolean }).created);
  }

  async fileRename(sid: string, oldPath: string, newPath: string, ms: number): Promise<EntryInfo> {
    return entryFromCLI(parseJSON(await this.call(["files", "mv", "--json", sid, oldPath, newPath], new Deadline(ms / 1000)), "files mv"));
  }

  async fileRemove(sid: string, path: string, ms: number): Promise<void> {
    await this.call(["files", "rm", sid, path], new Deadline(ms / 1000));
  }

  async *fileWatch(sid: string, path: string, recursive: boolean, idleMs: number, signal: AbortSignal): AsyncGenerator<FilesystemEvent | undefined> {
    const args = ["files", "watch", "--json", ...(recursive ? ["--recursive"] : []), sid, path];
    // No heartbeats come through the CLI: a quiet directory is no failure.
    const idle = new IdleTimer(2 ** 31 - 1, "roche files watch", signal);
    void idleMs;
    let line = "";
    for await (const b of this.filesOutput(args, idle)) {
      line += b.toString("utf8");
      let nl: number;
      while ((nl = line.indexOf("\n")) >= 0) {
        const one = line.slice(0, nl);
        line = line.slice(nl + 1);
        const ev = eventFromCLI(one);
        if (ev === "started") yield undefined;
        else if (ev) yield ev;
      }
    }
  }

  // Durable commands (commands.ts): roche exec --background and roche commands, with --json.

  async startCommand(sid: string, req: CommandRequest, d: Deadline): Promise<CommandInfo> {
    return parseCLICommand(parseJSON(await this.call(startArgs(sid, req), d), "exec --background"));
  }

  async *connectCommand(sid: string, sel: CommandSelector, stdoutOffset: number, stderrOffset: number, signal: AbortSignal): AsyncGenerator<CommandEvent> {
    const p = this.spawn(connectArgs(sid, sel, stdoutOffset, stderrOffset), false);
    const err: Buffer[] = [];
    type Item = { data: Buffer } | { end: true } | { error: unknown };
    const queue: Item[] = [];
    let wake: (() => void) | undefined;
    const push = (it: Item) => {
      queue.push(it);
      wake?.();
    };
    p.stdout!.on("data", (b: Buffer) => push({ data: b }));
    p.stderr!.on("data", (b: Buffer) => err.push(b));
    p.on("error", (e) => push({ error: this.unavailable(e) }));
    let rc = 0;
    void exited(p).then((c) => {
      rc = c;
      push({ end: true });
    });
    const onAbort = () => push({ error: signal.reason });
    signal.addEventListener("abort", onAbort, { once: true });
    let ended = false;
    let buf = "";
    try {
      for (;;) {
        while (queue.length === 0) await new Promise<void>((r) => (wake = r));
        wake = undefined;
        const it = queue.shift()!;
        if ("error" in it) throw it.error;
        if ("end" in it) break;
        buf += it.data.toString("utf8");
        let nl: number;
        while (!ended && (nl = buf.indexOf("\n")) >= 0) {
          const line = buf.slice(0, nl);
          buf = buf.slice(nl + 1);
          const ev = cliEvent(line);
          if (ev) {
            ended = ev.kind === "end";
            yield ev;
          }
        }
      }
      if (!ended) throw errorFromStderr(Buffer.concat(err), rc, "commands connect");
    } finally {
      signal.removeEventListener("abort", onAbort);
      if (!ended) await stop(p); // left early, or failed: this connection ends (the command goes on)
    }
  }

  async listCommands(sid: string, d: Deadline): Promise<CommandInfo[]> {
    const list = parseJSON(await this.call(listArgs(sid), d), "commands list");
    return Array.isArray(list) ? list.map(parseCLICommand) : [];
  }

  async sendCommandInput(sid: string, sel: CommandSelector, data: Uint8Array, d: Deadline): Promise<void> {
    const r = await this.run(sendArgs(sid, sel), d, data);
    if (r.rc !== 0) throw errorFromStderr(r.err, r.rc, "commands send-stdin");
  }

  async closeCommandInput(sid: string, sel: CommandSelector, d: Deadline): Promise<void> {
    await this.call(closeArgs(sid, sel), d);
  }

  async signalCommand(sid: string, sel: CommandSelector, sig: number, d: Deadline): Promise<void> {
    await this.call(signalArgs(sid, sel, sig), d);
  }

  async createContext(sid: string, language: string, cwd: string | undefined, d: Deadline): Promise<Context> {
    const a = ["context", "create", "--sandbox", sid];
    if (language) a.push("--language", language);
    if (cwd) a.push("--cwd", cwd);
    const id = (await this.call(a, d)).toString().trim().split("\n")[0];
    if (!id) throw new RocheError("roche context create printed no context id");
    return { id, language: language || "python", cwd: cwd ?? "", default: false };
  }

  async contexts(sid: string, d: Deadline): Promise<Context[]> {
    const obj = parseJSON(await this.call(["context", "list", "--json", "--sandbox", sid], d), "context list");
    return ((obj as Record<string, unknown>[]) ?? []).map((c) => ({
      id: String(c.id ?? ""), language: String(c.language ?? ""), cwd: String(c.cwd ?? ""), default: Boolean(c.default),
    }));
  }

  async restartContext(sid: string, cid: string, d: Deadline): Promise<void> {
    await this.call(["context", "restart", "--sandbox", sid, cid], d);
  }

  async forkContext(sid: string, cid: string, d: Deadline): Promise<Context> {
    const id = (await this.call(["context", "fork", "--sandbox", sid, cid], d)).toString().trim().split("\n")[0];
    if (!id) throw new RocheError("roche context fork printed no context id");
    return (await this.contexts(sid, d)).find((c) => c.id === id) ?? { id, language: "python", cwd: "", default: false };
  }

  async removeContext(sid: string, cid: string, d: Deadline): Promise<void> {
    await this.call(["context", "rm", "--sandbox", sid, cid], d);
  }

  async deleteWorkspace(provider: string, name: string, d: Deadline): Promise<void> {
    await this.call(["workspace", "rm", "--provider", provider, name], d);
  }

  async egressLog(sid: string, d: Deadline): Promise<EgressDecision[]> {
    const out = (await this.roched(["egress", "log", "--json", sid], d)).toString();
    return lines(out).map((l) => egressDecision(JSON.parse(l)));
  }

  async egressSuggest(sid: string, d: Deadline): Promise<string[]> {
    return lines((await this.roched(["egress", "suggest", sid], d)).toString());
  }

  async egressPolicy(sid: string, allow: string[], remove: string[], d: Deadline): Promise<string[]> {
    let out = "";
    if (allow.length) out = (await this.roched(["egress", "allow", sid, ...allow], d)).toString();
    if (remove.length) out = (await this.roched(["egress", "deny", sid, ...remove], d)).toString();
    return lines(out);
  }

  async setSecret(name: string, value: string, sandbox: string | undefined, d: Deadline): Promise<string[]> {
    // The value goes on roche's standard input, never its command line (which any local
    // user can read in /proc); roche drops a trailing newline, which roched would refuse
    // (a control character), so one is refused here alike.
    if (/[\r\n]$/.test(value)) {
      throw new InvalidConfig(`invalid config: secret ${name}: the value holds a control character, which a request header cannot carry`);
    }
    const args = ["secret", "set", name, ...(sandbox ? ["--sandbox", sandbox] : [])];
    return lines((await this.roched(args, d, Buffer.from(value, "utf8"))).toString());
  }

  async listSecrets(d: Deadline): Promise<StoredSecret[]> {
    const out = parseJSON(await this.roched(["secret", "list", "--json"], d), "secret list");
    return ((out as unknown[] | null) ?? []).map(storedSecret);
  }

  async removeSecret(name: string, d: Deadline): Promise<void> {
    await this.roched(["secret", "rm", name], d);
  }

  async close(): Promise<void> {
    const held = [...this.holds.values()];
    this.holds.clear();
    const d = new Deadline(UNDO_TIMEOUT);
    await Promise.all(held.map((h) => h.finish(d)));
  }
}

function lines(s: string): string[] {
  return s.split("\n").filter((l) => l.trim() !== "");
}
