// PTY sessions: a command on a pseudo-terminal in the sandbox (default: the image's shell),
// driven with unary calls (input, resize, kill) and one server stream of its output, so they
// work over roched's plain HTTP/1.1. Shaped like E2B's `sandbox.pty`.

import type { DaemonTransport } from "./daemon.js";
import { Deadline } from "./deadline.js";
import { InvalidConfig, RocheError, SandboxTimeout, Unsupported } from "./errors.js";
import type { Transport } from "./transport.js";
import type { ExecResult } from "./types.js";

/** The most bytes one sendInput carries (the agent's frame). */
export const MAX_PTY_INPUT = 256 << 10;

/** What roched is asked to start. */
export interface PtyRequest {
  cols: number;
  rows: number;
  cmd?: string[];
  env?: Record<string, string>;
  workdir?: string;
}

export interface PtyCreateOptions {
  /** Terminal size in characters (80 x 24 by default). */
  cols?: number;
  rows?: number;
  /** The argv; default: the image's shell (/bin/bash, else /bin/sh). */
  cmd?: readonly string[];
  /** Receives the terminal's output as it writes it (escape sequences and all). Without
   * it, the output collects in `output`. */
  onData?: (data: Uint8Array) => void | Promise<void>;
  env?: Record<string, string>;
  workdir?: string;
}

const CLI_REFUSAL =
  "PTY sessions need roched (the CLI transport has no way to keep a terminal between calls): " +
  "start it with `roche daemon start`, or open one interactively with `roche shell ID`";

function size(cols: number, rows: number): void {
  for (const [name, v] of [["cols", cols], ["rows", rows]] as const) {
    if (!Number.isInteger(v) || v < 1 || v > 4096) throw new InvalidConfig(`${name} ${v}: give a number of characters from 1 to 4096`);
  }
}

function bytes(data: string | Uint8Array): Uint8Array {
  const b = typeof data === "string" ? new TextEncoder().encode(data) : data;
  if (b.length > MAX_PTY_INPUT) throw new InvalidConfig(`${b.length} bytes of input at once is over the limit of ${MAX_PTY_INPUT}: send it in parts`);
  return b;
}

/** A running PTY session. */
export class PtyHandle {
  /** The output so far, when no onData was given. */
  readonly output: Uint8Array[] = [];
  /** The result, once the session has ended. */
  result: ExecResult | undefined;
  private readonly stop = new AbortController();
  private readonly done: Promise<ExecResult>;

  constructor(
    private readonly t: DaemonTransport,
    private readonly sid: string,
    readonly pid: number,
    onData: PtyCreateOptions["onData"],
    private readonly timeout: number,
  ) {
    this.done = (async () => {
      for await (const item of this.t.connectPty(sid, pid, this.stop.signal)) {
        if (item instanceof Uint8Array) {
          if (onData) await onData(item);
          else this.output.push(item);
        } else {
          this.result = item;
          return item;
        }
      }
      throw new RocheError("roched ended the terminal's output stream without a result");
    })();
    this.done.catch(() => undefined); // reported by wait()
  }

  /** Types data into the terminal: "ls\n", "\x03" (Ctrl-C), "\x04" (Ctrl-D). */
  async sendInput(data: string | Uint8Array): Promise<void> {
    await this.t.ptyInput(this.sid, this.pid, bytes(data), new Deadline(this.timeout));
  }

  /** Sets the terminal's size; its program gets SIGWINCH. */
  async resize(cols: number, rows: number): Promise<void> {
    size(cols, rows);
    await this.t.ptyResize(this.sid, this.pid, cols, rows, new Deadline(this.timeout));
  }

  /** Kills the session's command and everything it started. */
  async kill(): Promise<void> {
    await this.t.ptyKill(this.sid, this.pid, new Deadline(this.timeout));
  }

  /** Waits for the session to end and returns its result (`exitCode`); SandboxTimeout
   * when `timeout` seconds pass first (the session goes on). */
  async wait(o: { timeout?: number } = {}): Promise<ExecResult> {
    if (o.timeout === undefined) return this.done;
    let timer: NodeJS.Timeout | undefined;
    const expired = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new SandboxTimeout(`timed out: the terminal ${this.pid} did not end within ${o.timeout} s (it still runs)`)), o.timeout! * 1000);
    });
    try {
      return await Promise.race([this.done, expired]);
    } finally {
      clearTimeout(timer);
    }
  }

  /** Stops reading the output; the session goes on (connect to it again with pty.connect). */
  disconnect(): void {
    this.stop.abort(new RocheError(`disconnected from terminal ${this.pid}`));
  }
}

/** `sandbox.pty`: terminals in a sandbox, through roched. */
export class Pty {
  constructor(private readonly transport: Transport, private readonly sid: string, private readonly timeout: number) {}

  private daemon(): DaemonTransport {
    if (this.transport.name !== "daemon") throw new Unsupported(CLI_REFUSAL);
    return this.transport as DaemonTransport;
  }

  private deadline(): Deadline {
    return new Deadline(this.timeout);
  }

  /** Starts `cmd` (default: the image's shell) on a terminal of cols x rows, as the sandbox
   * user under every limit of the sandbox. It runs until it exits, kill(), or the sandbox ends. */
  async create(o: PtyCreateOptions = {}): Promise<PtyHandle> {
    const cols = o.cols ?? 80;
    const rows = o.rows ?? 24;
    size(cols, rows);
    if (o.cmd !== undefined && (!Array.isArray(o.cmd) || !o.cmd.every((a) => typeof a === "string"))) {
      throw new InvalidConfig("cmd must be an array of strings (the argv), e.g. [\"python3\"]");
    }
    const t = this.daemon();
    const pid = await t.createPty(this.sid, { cols, rows, cmd: o.cmd ? [...o.cmd] : undefined, env: o.env, workdir: o.workdir }, this.deadline());
    return new PtyHandle(t, this.sid, pid, o.onData, this.timeout);
  }

  /** A handle on a session started before: its recent output is replayed first. */
  connect(pid: number, o: { onData?: PtyCreateOptions["onData"] } = {}): PtyHandle {
    return new PtyHandle(this.daemon(), this.sid, pid, o.onData, this.timeout);
  }

  /** Types data into session `pid`. */
  async sendInput(pid: number, data: string | Uint8Array): Promise<void> {
    await this.daemon().ptyInput(this.sid, pid, bytes(data), this.deadline());
  }

  /** Resizes session `pid`. */
  async resize(pid: number, cols: number, rows: number): Promise<void> {
    size(cols, rows);
    await this.daemon().ptyResize(this.sid, pid, cols, rows, this.deadline());
  }

  /** Kills session `pid`. */
  async kill(pid: number): Promise<void> {
    await this.daemon().ptyKill(this.sid, pid, this.deadline());
  }
}
