// Durable commands, `sandbox.commands`, shaped like E2B's: run a shell command line (or an
// argv) in the foreground or the background, list the commands, connect to one from byte
// offsets, feed its stdin, signal and kill it. A command belongs to the sandbox, not to this
// process: it runs on when this process disconnects, is killed, or roched restarts, and its
// output is kept in the sandbox (the last 16 MiB of each stream by default) for the next
// connection to replay.

import { randomUUID } from "node:crypto";
import { Deadline } from "./deadline.js";
import { InvalidConfig, ProviderUnavailable, RocheError, SandboxNotFound, SandboxTimeout } from "./errors.js";
import { TLSFailure } from "./tls.js";
import type { Transport } from "./transport.js";
import type { OutputEvent } from "./types.js";

/** The most bytes one sendStdin call carries to the agent; more is sent in pieces. */
export const MAX_COMMAND_INPUT = 256 << 10;
/** How long a foreground run may take unless told otherwise (E2B's default), in ms. */
export const DEFAULT_RUN_TIMEOUT_MS = 60_000;
/** The most output a command keeps per stream in the sandbox (its window). */
export const MAX_COMMAND_WINDOW = 64 << 20;
/** The output a CommandResult keeps per stream. */
const KEEP_OUTPUT = 64 << 20;
/** How long a handle keeps trying to connect again after its connection broke (roched
 * restarting), before it gives up with the error. */
const RECONNECT_FOR_MS = 60_000;

/** A command line runs in the image's bash as a login shell, as E2B's SDKs run it
 * (/bin/bash -l -c LINE), and in sh where the image has no bash. */
export const SHELL = ["/bin/sh", "-c", 'if command -v bash >/dev/null 2>&1; then exec bash -l -c "$1"; fi; exec sh -c "$1"', "sh"];

/** How a command ended, with its output as this SDK received it. A non-zero exit, a
 * timeout or an OOM kill are results, not errors. When the exit status cannot be known
 * (the sandbox stopped under the command), `exitCode` is -1 and `unknown` says why: a
 * status is never made up. */
export interface CommandResult {
  stdout: string;
  stderr: string;
  exitCode: number;
  pid: number;
  /** The signal that killed it (`exitCode` is then 128 + signal); 0 when it exited. */
  signal: number;
  timedOut: boolean;
  oomKilled: boolean;
  /** Seconds the command ran. */
  duration: number;
  unknown: string;
  /** More than 64 MiB of a stream came: the rest is not in stdout/stderr. */
  truncated: boolean;
  /** The command exited 0 without timing out. */
  ok: boolean;
  /** E2B's name: why the command did not succeed, undefined when it did. */
  error?: string;
}

/** A command of `sandbox.commands.list()`, running or ended (E2B's ProcessInfo). */
export interface CommandInfo {
  pid: number;
  tag?: string;
  /** The argv it was started with (a shell line is ["/bin/sh", "-c", ..., "sh", LINE]). */
  argv: string[];
  /** E2B's names: the program and its arguments. */
  cmd: string;
  args: string[];
  envs: Record<string, string>;
  cwd: string;
  running: boolean;
  /** Its stdin is open for sendStdin. */
  stdin: boolean;
  /** A terminal session (`sandbox.pty`). */
  pty: boolean;
  startedAt?: Date;
  /** The output kept per stream, and the offsets of the first byte still kept and of the
   * next byte (each stream's length so far). */
  window: number;
  firstStdout: number;
  firstStderr: number;
  stdoutBytes: number;
  stderrBytes: number;
  /** Once it has ended: its exit status (-1 when unknown), signal and why unknown. */
  exitCode?: number;
  signal: number;
  unknown: string;
}

/** What roched (or the CLI) is asked to start. */
export interface CommandRequest {
  argv: string[];
  envs: Record<string, string>;
  cwd?: string;
  /** Seconds before the command is killed; undefined: the sandbox's remaining lifetime. */
  timeout?: number;
  tag?: string;
  stdin: boolean;
  window?: number;
  key?: string;
}

/** A command named by its pid, or by the tag it was started with. */
export type CommandSelector = { pid: number } | { tag: string };

/** What a connection to a command hears, from either transport. */
export type CommandEvent =
  | { kind: "start"; pid: number; tag?: string; stdoutOffset: number; stderrOffset: number }
  | { kind: "data"; stream: "stdout" | "stderr"; offset: number; data: Uint8Array }
  | { kind: "end"; exitCode: number; signal: number; timedOut: boolean; oomKilled: boolean; duration: number; unknown: string };

type OnOutput = (text: string) => void | Promise<void>;

export interface CommandRunOptions {
  /** Return a CommandHandle at once; the command runs until it ends, is killed, or the
   * sandbox ends. */
  background?: boolean;
  /** Its working directory, and what it adds to the environment. */
  cwd?: string;
  envs?: Record<string, string>;
  /** Names it for list() and the other calls. */
  tag?: string;
  /** Keeps its stdin open for sendStdin until closeStdin. */
  stdin?: boolean;
  /** Get its output as text as it comes. */
  onStdout?: OnOutput;
  onStderr?: OnOutput;
  /** Kills it after this many ms: 60 s by default in the foreground, none in the background;
   * 0 means the sandbox's lifetime. */
  timeoutMs?: number;
  /** The output kept per stream in the sandbox for a later connect (default 16 MiB, at most 64 MiB). */
  window?: number;
  /** A repeated run with the key joins the first one's command instead of starting another
   * (a run makes one of its own, so that its retries after a dropped connection start it once). */
  idempotencyKey?: string;
}

export interface CommandConnectOptions {
  /** Where the replay starts in each stream (0: its start; -1: only what comes next). */
  stdoutOffset?: number;
  stderrOffset?: number;
  onStdout?: OnOutput;
  onStderr?: OnOutput;
}

function selector(pid: number | { tag: string }): CommandSelector {
  if (typeof pid === "object" && pid !== null && typeof pid.tag === "string" && pid.tag) return { tag: pid.tag };
  if (typeof pid === "number" && Number.isInteger(pid) && pid > 0) return { pid };
  throw new InvalidConfig(`invalid config: ${JSON.stringify(pid)}: give the pid run() returned (commands.list() shows them), or { tag }`);
}

function offset(v: number | undefined, name: string): number {
  if (v === undefined) return 0;
  if (!Number.isInteger(v)) throw new InvalidConfig(`invalid config: ${name} ${v}: give a byte offset (an integer; -1 for only what comes next)`);
  return v;
}

const SIGNALS: Record<string, number> = {
  HUP: 1, INT: 2, QUIT: 3, ILL: 4, TRAP: 5, ABRT: 6, BUS: 7, FPE: 8, KILL: 9, USR1: 10, SEGV: 11, USR2: 12, PIPE: 13,
  ALRM: 14, TERM: 15, CHLD: 17, CONT: 18, STOP: 19, TSTP: 20, TTIN: 21, TTOU: 22, URG: 23, XCPU: 24, XFSZ: 25,
  VTALRM: 26, PROF: 27, WINCH: 28, IO: 29, PWR: 30, SYS: 31,
};

/** A signal by number (15) or name ("TERM", "SIGTERM"). */
export function signalNumber(sig: number | string): number {
  if (typeof sig === "number" && Number.isInteger(sig) && sig > 0 && sig <= 64) return sig;
  if (typeof sig === "string") {
    const n = SIGNALS[sig.toUpperCase().replace(/^SIG/, "")];
    if (n) return n;
  }
  throw new InvalidConfig(`invalid config: ${JSON.stringify(sig)} is not a signal: give a number (1 to 64) or a name such as TERM, KILL, INT or HUP`);
}

/** run()'s arguments, checked: a string is a shell command line, an array the argv. */
export function makeCommandRequest(cmd: string | readonly string[], o: CommandRunOptions): CommandRequest {
  let argv: string[];
  if (typeof cmd === "string") {
    if (!cmd.trim()) throw new InvalidConfig("invalid config: empty command: give a shell command line or the argv");
    argv = [...SHELL, cmd];
  } else if (Array.isArray(cmd) && cmd.length > 0 && cmd.every((a) => typeof a === "string")) {
    argv = [...cmd];
  } else {
    throw new InvalidConfig("invalid config: cmd must be a shell command line (a string) or the argv (an array of strings)");
  }
  let timeoutMs = o.timeoutMs ?? (o.background ? undefined : DEFAULT_RUN_TIMEOUT_MS);
  if (timeoutMs !== undefined && (typeof timeoutMs !== "number" || !(timeoutMs >= 0))) {
    throw new InvalidConfig(`invalid config: timeoutMs ${timeoutMs}: give milliseconds > 0, or 0 for the sandbox's lifetime`);
  }
  if (timeoutMs === 0) timeoutMs = undefined;
  if (o.window !== undefined && (!Number.isInteger(o.window) || o.window <= 0 || o.window > MAX_COMMAND_WINDOW)) {
    throw new InvalidConfig(`invalid config: window ${o.window}: give bytes per stream, from 1 to ${MAX_COMMAND_WINDOW} (64 MiB)`);
  }
  return {
    argv, envs: { ...(o.envs ?? {}) }, cwd: o.cwd || undefined, timeout: timeoutMs === undefined ? undefined : timeoutMs / 1000,
    tag: o.tag || undefined, stdin: Boolean(o.stdin), window: o.window, key: o.idempotencyKey || undefined,
  };
}

/** Whether a connection to a command failed in a way a new one may not: the connection to
 * roched broke or roched is restarting, as opposed to an answer (no such command or sandbox,
 * an offset that fell out of the window). */
function retryable(e: unknown): boolean {
  if (e instanceof TLSFailure) return false;
  if (e instanceof ProviderUnavailable) return true;
  return e instanceof RocheError && e.constructor === RocheError && !e.reason;
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** Follows one command across connections: the offsets to connect from next, the output
 * kept for its result, its text decoded with characters split across pieces whole. */
class Assembler {
  next = { stdout: 0, stderr: 0 };
  pid = 0;
  private kept = { stdout: [] as Uint8Array[], stderr: [] as Uint8Array[] };
  private keptBytes = { stdout: 0, stderr: 0 };
  private decoders = { stdout: new TextDecoder(), stderr: new TextDecoder() };
  truncated = false;

  constructor(stdoutOffset = 0, stderrOffset = 0) {
    this.next = { stdout: stdoutOffset, stderr: stderrOffset };
  }

  started(ev: Extract<CommandEvent, { kind: "start" }>): void {
    this.pid = ev.pid;
    this.next = { stdout: ev.stdoutOffset, stderr: ev.stderrOffset };
  }

  data(ev: Extract<CommandEvent, { kind: "data" }>): OutputEvent | undefined {
    const skip = this.next[ev.stream] - ev.offset;
    if (skip < 0) throw new RocheError(`the command's ${ev.stream} skipped from offset ${this.next[ev.stream]} to ${ev.offset}: bytes were lost`);
    const data = ev.data.subarray(skip);
    if (data.length === 0) return undefined;
    const off = ev.offset + skip;
    this.next[ev.stream] = off + data.length;
    const room = KEEP_OUTPUT - this.keptBytes[ev.stream];
    if (data.length > room) this.truncated = true;
    if (room > 0) {
      const piece = data.subarray(0, room);
      this.kept[ev.stream].push(piece);
      this.keptBytes[ev.stream] += piece.length;
    }
    return { stream: ev.stream, data, text: this.decoders[ev.stream].decode(data, { stream: true }), offset: off };
  }

  text(s: "stdout" | "stderr"): string {
    return new TextDecoder().decode(Buffer.concat(this.kept[s]));
  }

  result(end: Extract<CommandEvent, { kind: "end" }>): CommandResult {
    const r: CommandResult = {
      stdout: this.text("stdout"), stderr: this.text("stderr"), exitCode: end.exitCode, pid: this.pid, signal: end.signal,
      timedOut: end.timedOut, oomKilled: end.oomKilled, duration: end.duration, unknown: end.unknown, truncated: this.truncated,
      ok: end.exitCode === 0 && !end.timedOut && !end.unknown,
    };
    if (end.unknown) r.error = end.unknown;
    else if (end.timedOut) r.error = `the command timed out after ${end.duration.toPrecision(3)} s and was killed`;
    else if (end.signal) r.error = `killed by signal ${end.signal}`;
    else if (end.exitCode) r.error = `exit status ${end.exitCode}`;
    return r;
  }
}

/** A command that runs on in the sandbox: started with `run(cmd, { background: true })` or
 * found with `connect()`. `wait()` resolves to its CommandResult once it ends; iterating
 * (`for await (const ev of handle)`) yields its output as OutputEvents (each with its
 * `offset`), after which `result` is set. With `onStdout` or `onStderr`, the output goes to
 * them as it comes instead. A connection that breaks (roched restarting) is made again from
 * the offsets reached, so no byte is lost or repeated; `disconnect()` stops reading, and the
 * command goes on. */
export class CommandHandle implements AsyncIterable<OutputEvent> {
  /** How the command ended, once this handle has seen it end. */
  result: CommandResult | undefined;
  private readonly stop = new AbortController();
  private reading: Promise<CommandResult> | undefined;

  constructor(
    private readonly commands: Commands,
    readonly pid: number,
    private readonly asm: Assembler,
    onStdout?: OnOutput,
    onStderr?: OnOutput,
  ) {
    if (onStdout || onStderr) this.reading = this.read(onStdout, onStderr);
    this.reading?.catch(() => undefined); // reported by wait()
  }

  /** The offset of the next stdout byte this handle will see: connect() from here (with
   * stderrOffset) to go on where it left off. */
  get stdoutOffset(): number {
    return this.asm.next.stdout;
  }

  get stderrOffset(): number {
    return this.asm.next.stderr;
  }

  /** The output this handle has seen so far (E2B's names). */
  get stdout(): string {
    return this.asm.text("stdout");
  }

  get stderr(): string {
    return this.asm.text("stderr");
  }

  /** The output from where this handle is, connecting again after a broken connection for
   * up to a minute; `result` is set at the end. */
  async *events(): AsyncGenerator<OutputEvent> {
    let giveUp: number | undefined;
    let delay = 100;
    while (!this.result) {
      if (this.stop.signal.aborted) return;
      try {
        const stream = this.commands.transport.connectCommand(this.commands.sid, { pid: this.pid }, this.asm.next.stdout, this.asm.next.stderr, this.stop.signal);
        for await (const ev of stream) {
          giveUp = undefined;
          delay = 100;
          if (ev.kind === "start") this.asm.started(ev);
          else if (ev.kind === "data") {
            const out = this.asm.data(ev);
            if (out) yield out;
          } else this.result = this.asm.result(ev);
        }
      } catch (e) {
        if (this.stop.signal.aborted) return;
        if (!retryable(e)) throw e;
        const now = Date.now();
        giveUp ??= now + RECONNECT_FOR_MS;
        if (now >= giveUp) throw e;
        await sleep(delay);
        delay = Math.min(delay * 2, 2000);
      }
    }
  }

  [Symbol.asyncIterator](): AsyncGenerator<OutputEvent> {
    if (this.reading) throw new RocheError("this handle's output goes to its onStdout and onStderr: use wait()");
    return this.events();
  }

  private async read(onStdout?: OnOutput, onStderr?: OnOutput): Promise<CommandResult> {
    for await (const ev of this.events()) {
      const h = ev.stream === "stderr" ? onStderr : onStdout;
      if (h && ev.text) await h(ev.text);
    }
    if (!this.result) throw new RocheError(`disconnected from command ${this.pid} before it ended (it goes on)`);
    return this.result;
  }

  /** Waits for the command to end and resolves to its CommandResult (a non-zero exit is a
   * result; `exitCode` is -1 with `unknown` saying why when the status cannot be known).
   * `onStdout`/`onStderr` get the rest of its output as text. SandboxTimeout when
   * `timeoutMs` passes first (the command goes on). */
  async wait(o: { onStdout?: OnOutput; onStderr?: OnOutput; timeoutMs?: number } = {}): Promise<CommandResult> {
    if (this.result) return this.result;
    this.reading ??= this.read(o.onStdout, o.onStderr);
    if (o.timeoutMs === undefined) return this.reading;
    let timer: NodeJS.Timeout | undefined;
    const expired = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new SandboxTimeout(`timed out: command ${this.pid} did not end within ${o.timeoutMs} ms (it goes on)`)), o.timeoutMs);
    });
    try {
      return await Promise.race([this.reading, expired]);
    } finally {
      clearTimeout(timer);
    }
  }

  /** Kills the command and everything it started (SIGKILL to its process group); false
   * when it had already ended. */
  kill(): Promise<boolean> {
    return this.commands.kill(this.pid);
  }

  /** Sends a signal (15, "TERM", "SIGINT", ...) to the command's process group. */
  signal(sig: number | string): Promise<void> {
    return this.commands.signal(this.pid, sig);
  }

  /** Writes data to the command's stdin (started with `stdin: true`). */
  sendStdin(data: string | Uint8Array): Promise<void> {
    return this.commands.sendStdin(this.pid, data);
  }

  /** Closes the command's stdin: it reads end of file from then on. */
  closeStdin(): Promise<void> {
    return this.commands.closeStdin(this.pid);
  }

  /** Stops reading the command's output; the command goes on (`connect()` it again from
   * `stdoutOffset` and `stderrOffset`). */
  disconnect(): void {
    this.stop.abort(new RocheError(`disconnected from command ${this.pid}`));
  }
}

/** `sandbox.commands`: durable commands in a sandbox, E2B's calls by E2B's names. */
export class Commands {
  constructor(readonly transport: Transport, readonly sid: string, private readonly timeout: number) {}

  private deadline(): Deadline {
    return new Deadline(this.timeout);
  }

  /**
   * Runs `cmd`, a shell command line (run by the image's `bash -l -c`, else `sh -c`) or an
   * argv array, as the sandbox user under every limit of the sandbox. In the foreground it
   * resolves to the CommandResult once the command ends (a non-zero exit is a result, not an
   * error); `timeoutMs` (default 60 s; 0: the sandbox's lifetime) kills it and sets
   * `timedOut`. With `background: true` it resolves to a CommandHandle at once. Either way the
   * command belongs to the sandbox: a dropped connection is made again from the offsets
   * reached, and a foreground run whose reading fails kills its command.
   */
  run(cmd: string | readonly string[], o: CommandRunOptions & { background: true }): Promise<CommandHandle>;
  run(cmd: string | readonly string[], o?: CommandRunOptions & { background?: false }): Promise<CommandResult>;
  async run(cmd: string | readonly string[], o: CommandRunOptions = {}): Promise<CommandResult | CommandHandle> {
    const req = makeCommandRequest(cmd, { ...o, idempotencyKey: o.idempotencyKey || `run-${randomUUID()}` });
    if (o.background) {
      const info = await this.start(req);
      return new CommandHandle(this, info.pid, new Assembler(), o.onStdout, o.onStderr);
    }
    let info: CommandInfo;
    try {
      info = await this.start(req);
    } catch (e) {
      const failed = e instanceof SandboxNotFound ? startFailure(e) : undefined;
      if (failed) return failed;
      throw e;
    }
    const h = new CommandHandle(this, info.pid, new Assembler());
    try {
      return await h.wait({ onStdout: o.onStdout, onStderr: o.onStderr });
    } catch (e) {
      // Given up (its reading failed, or its callback threw): a foreground command goes too.
      if (!h.result) await this.kill(info.pid).catch(() => undefined);
      throw e;
    }
  }

  /** Starts req, trying again with its idempotency key while roched cannot be reached (a
   * start whose answer was lost is not started twice). */
  private async start(req: CommandRequest): Promise<CommandInfo> {
    let giveUp: number | undefined;
    let delay = 100;
    for (;;) {
      try {
        return await this.transport.startCommand(this.sid, req, this.deadline());
      } catch (e) {
        if (!retryable(e) || !req.key) throw e;
        const now = Date.now();
        giveUp ??= now + RECONNECT_FOR_MS;
        if (now >= giveUp) throw e;
        await sleep(delay);
        delay = Math.min(delay * 2, 2000);
      }
    }
  }

  /** The sandbox's commands, running or ended (the last 64 ended are kept), oldest first. */
  list(): Promise<CommandInfo[]> {
    return this.transport.listCommands(this.sid, this.deadline());
  }

  /** A handle on a command started before (by this process or another: its pid, or
   * `{ tag }`), whose output is replayed from the byte offsets given (0: from its start;
   * -1: only what comes next) and then followed. An offset that fell out of the command's
   * window throws OutputGone naming the first offset still kept. */
  async connect(pid: number | { tag: string }, o: CommandConnectOptions = {}): Promise<CommandHandle> {
    const sel = selector(pid);
    const asm = new Assembler(offset(o.stdoutOffset, "stdoutOffset"), offset(o.stderrOffset, "stderrOffset"));
    let p = "pid" in sel ? sel.pid : 0;
    if ("tag" in sel) {
      const found = (await this.list()).filter((c) => c.tag === sel.tag);
      if (found.length === 0) throw new SandboxNotFound(`not found: no command tagged ${JSON.stringify(sel.tag)} in sandbox ${this.sid}`);
      p = found[found.length - 1].pid;
    }
    return new CommandHandle(this, p, asm, o.onStdout, o.onStderr);
  }

  /** Writes data to the stdin of a command started with `stdin: true`. */
  async sendStdin(pid: number | { tag: string }, data: string | Uint8Array): Promise<void> {
    const sel = selector(pid);
    const b = typeof data === "string" ? new TextEncoder().encode(data) : data;
    for (let i = 0; i === 0 || i < b.length; i += MAX_COMMAND_INPUT) {
      await this.transport.sendCommandInput(this.sid, sel, b.subarray(i, i + MAX_COMMAND_INPUT), this.deadline());
    }
  }

  /** Closes a command's stdin: it reads end of file from then on. */
  closeStdin(pid: number | { tag: string }): Promise<void> {
    return this.transport.closeCommandInput(this.sid, selector(pid), this.deadline());
  }

  /** Kills a command and everything it started (SIGKILL to its process group); false when
   * there was no such command running (E2B's answer). */
  async kill(pid: number | { tag: string }): Promise<boolean> {
    try {
      await this.transport.signalCommand(this.sid, selector(pid), 9, this.deadline());
    } catch (e) {
      if (e instanceof SandboxNotFound) return false;
      throw e;
    }
    return true;
  }

  /** Sends a signal (15, "TERM", "SIGINT", ...) to a command's process group. */
  signal(pid: number | { tag: string }, sig: number | string): Promise<void> {
    return this.transport.signalCommand(this.sid, selector(pid), signalNumber(sig), this.deadline());
  }
}

/** A foreground argv whose program could not start is a result, as a shell reports it (127
 * not found, 126 not executable): the agent refuses the start with its own message. */
function startFailure(e: SandboxNotFound): CommandResult | undefined {
  const i = e.message.indexOf("roche-agent: ");
  if (i < 0) return undefined;
  const msg = e.message.slice(i).trim();
  const exitCode = msg.endsWith("command not found") || msg.toLowerCase().endsWith("no such file or directory") ? 127 : 126;
  return {
    stdout: "", stderr: msg + "\n", exitCode, pid: 0, signal: 0, timedOut: false, oomKilled: false, duration: 0,
    unknown: "", truncated: false, ok: false, error: `exit status ${exitCode}`,
  };
}

// The CLI's side: roche exec --background and roche commands, with --json.

function selArgs(sel: CommandSelector): string[] {
  return "tag" in sel ? ["--tag", sel.tag] : [String(sel.pid)];
}

export function startArgs(sid: string, req: CommandRequest): string[] {
  const a = ["exec", "--sandbox", sid, "--background", "--json"];
  if (req.timeout) a.push("--timeout", String(req.timeout));
  for (const [k, v] of Object.entries(req.envs)) a.push("--env", `${k}=${v}`);
  if (req.cwd) a.push("--workdir", req.cwd);
  if (req.tag) a.push("--tag", req.tag);
  if (req.stdin) a.push("--keep-stdin");
  if (req.window) a.push("--window", String(req.window));
  if (req.key) a.push("--idempotency-key", req.key);
  return [...a, "--", ...req.argv];
}

export function connectArgs(sid: string, sel: CommandSelector, stdoutOffset: number, stderrOffset: number): string[] {
  return ["commands", "connect", "--sandbox", sid, "--json", "--stdout-offset", String(stdoutOffset), "--stderr-offset", String(stderrOffset), ...selArgs(sel)];
}

export const listArgs = (sid: string) => ["commands", "list", "--sandbox", sid, "--json"];
export const sendArgs = (sid: string, sel: CommandSelector) => ["commands", "send-stdin", "--sandbox", sid, ...selArgs(sel)];
export const closeArgs = (sid: string, sel: CommandSelector) => ["commands", "close-stdin", "--sandbox", sid, ...selArgs(sel)];
export const signalArgs = (sid: string, sel: CommandSelector, sig: number) => ["commands", "signal", "--sandbox", sid, ...selArgs(sel), String(sig)];

const int = (v: unknown): number => {
  const n = Number(v ?? 0);
  return Number.isFinite(n) ? n : 0;
};

/** A command as `roche exec --background --json` and `roche commands list --json` print it
 * (Go's field names). */
export function parseCLICommand(m: unknown): CommandInfo {
  if (!m || typeof m !== "object") throw new RocheError(`the roche CLI printed ${JSON.stringify(m)} where a command was expected`);
  const o = m as Record<string, any>;
  const end = o.end && typeof o.end === "object" ? o.end : undefined;
  const argv: string[] = Array.isArray(o.cmd) ? o.cmd.map(String) : [];
  return {
    pid: int(o.pid), tag: o.tag || undefined, argv, cmd: argv[0] ?? "", args: argv.slice(1), envs: { ...(o.env ?? {}) },
    cwd: String(o.workdir ?? ""), running: Boolean(o.running), stdin: Boolean(o.stdin), pty: Boolean(o.tty),
    startedAt: o.started_at ? new Date(o.started_at) : undefined, window: int(o.window),
    firstStdout: int(o.first?.stdout), firstStderr: int(o.first?.stderr), stdoutBytes: int(o.written?.stdout), stderrBytes: int(o.written?.stderr),
    exitCode: end ? int(end.exit_code) : undefined, signal: end ? int(end.signal) : 0, unknown: end ? String(end.unknown ?? "") : "",
  };
}

/** One line of `roche commands connect --json`. */
export function cliEvent(line: string): CommandEvent | undefined {
  let m: any;
  try {
    m = JSON.parse(line);
  } catch {
    throw new RocheError(`the roche CLI printed ${JSON.stringify(line.slice(0, 200))} where a command's event was expected`);
  }
  if (!m || typeof m !== "object") return undefined;
  if (m.start) return { kind: "start", pid: int(m.start.pid), tag: m.start.tag || undefined, stdoutOffset: int(m.start.stdout_offset), stderrOffset: int(m.start.stderr_offset) };
  if (m.stream) return { kind: "data", stream: m.stream === "stderr" ? "stderr" : "stdout", offset: int(m.offset), data: Buffer.from(m.data ?? "", "base64") };
  if (m.end) {
    const e = m.end;
    return { kind: "end", exitCode: int(e.exit_code), signal: int(e.signal), timedOut: Boolean(e.timed_out), oomKilled: Boolean(e.oom_killed), duration: int(e.duration_ns) / 1e9, unknown: String(e.unknown ?? "") };
  }
  return undefined;
}
