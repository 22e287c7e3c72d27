// The API: Roche creates sandboxes with secure defaults; a Sandbox runs commands and moves files.

import { CLITransport } from "./cli.js";
import {
  checkLanguage,
  contextId,
  DEFAULT_CODE_TIMEOUT,
  dispatch,
  Execution,
  makeCodeRequest,
  type Context,
  type RunCodeOptions,
} from "./code.js";
import { DaemonTransport, health } from "./daemon.js";
import { Pty } from "./pty.js";
import { Files } from "./files.js";
import { Commands } from "./commands.js";
import { Deadline } from "./deadline.js";
import { checkTraceparent, endpoint, findCLI, where, type Endpoint } from "./discovery.js";
import { InvalidConfig, ProviderUnavailable, RocheError } from "./errors.js";
import { TLSFailure } from "./tls.js";
import type { StreamItem, Transport } from "./transport.js";
import {
  baseName,
  checkListOptions,
  copyLimit,
  makeConfig,
  makeExecRequest,
  type CreateOptions,
  type EgressDecision,
  type ExecOptions,
  type ExecRequest,
  type ExecResult,
  type ListOptions,
  type OutputEvent,
  type SandboxInfo,
  type StoredSecret,
} from "./types.js";

// Node 18 has no Symbol.asyncDispose; TypeScript's `await using` looks it up by this name too.
(Symbol as { asyncDispose?: symbol }).asyncDispose ??= Symbol.for("Symbol.asyncDispose");

/** How long the SDK waits for roched's /healthz before working through the CLI, as the CLI does. */
const PROBE_TIMEOUT_MS = 2000;
const TRANSPORTS = ["auto", "daemon", "cli"] as const;

export interface RocheOptions {
  /** "docker" (the default), "wasm", or a microVM provider ("qemu", "firecracker"). */
  provider?: string;
  /** "auto" (the default): roched when it answers on its socket and serves the provider,
   * else the roche CLI. "daemon" or "cli" forces one. */
  transport?: "auto" | "daemon" | "cli";
  /** roched's unix socket; default $ROCHE_SOCKET, else $XDG_RUNTIME_DIR/roche/roched.sock,
   * else ~/.roche/roched.sock. */
  socket?: string;
  /** A roched on TCP, "https://HOST:PORT" (TLS, verified) or "http://HOST:PORT" (plaintext,
   * loopback); it wants a token (or a client certificate). */
  address?: string;
  /** A PEM file of the CA that verifies roched at an https:// address; default
   * $ROCHE_CA_FILE, else Node's CAs. */
  ca?: string;
  /** PEM client certificate and key for a roched with --client-ca; default
   * $ROCHE_CLIENT_CERT and $ROCHE_CLIENT_KEY. */
  clientCert?: string;
  clientKey?: string;
  /** The bearer token for a roched on TCP; default from tokenFile, $ROCHE_TOKEN_FILE or $ROCHE_TOKEN. */
  token?: string;
  /** A file only you can read holding the token. */
  tokenFile?: string;
  /** A W3C traceparent ("00-TRACEID-SPANID-01"), or a function returning the current one,
   * sent with every call to roched so that its spans are children of that span
   * (docs/traces.md). No OpenTelemetry dependency: the application supplies the value. */
  traceparent?: string | (() => string | undefined);
  /** The roche CLI; default $ROCHE_CLI, else roche on PATH. */
  cli?: string;
  /** Seconds any call may wait for Roche beyond the time a command may run (60). */
  requestTimeout?: number;
}

/** Creates sandboxes with secure defaults on one provider. */
export class Roche {
  readonly provider: string;
  private readonly choice: "auto" | "daemon" | "cli";
  private readonly ep: Endpoint;
  private readonly cliPath?: string;
  readonly requestTimeout: number;
  private chosen: Promise<Transport> | undefined;

  constructor(o: RocheOptions = {}) {
    const transport = o.transport ?? "auto";
    if (!TRANSPORTS.includes(transport)) {
      throw new InvalidConfig(`transport ${JSON.stringify(transport)}: choose one of ${TRANSPORTS.join(", ")}`);
    }
    const rt = o.requestTimeout ?? 60;
    if (!(rt > 0)) throw new InvalidConfig(`requestTimeout ${rt}: give seconds > 0`);
    this.provider = o.provider ?? "docker";
    this.choice = transport;
    this.ep = endpoint(o.socket, o.address, o.token, o.tokenFile, { ca: o.ca, clientCert: o.clientCert, clientKey: o.clientKey });
    if (typeof o.traceparent === "function") this.ep.traceparent = o.traceparent;
    else if (checkTraceparent(o.traceparent)) this.ep.traceparent = o.traceparent;
    this.cliPath = o.cli;
    this.requestTimeout = rt;
  }

  /** "daemon" or "cli": how this Roche reaches Roche (decided on first use). */
  async transport(): Promise<"daemon" | "cli"> {
    return (await this.resolve()).name;
  }

  /** @internal */
  resolve(): Promise<Transport> {
    this.chosen ??= this.choose().catch((e) => {
      this.chosen = undefined; // a later call tries again (roched may have started)
      throw e;
    });
    return this.chosen;
  }

  private async choose(): Promise<Transport> {
    let why: RocheError | undefined;
    if (this.choice !== "cli") {
      try {
        const h = await health(this.ep, PROBE_TIMEOUT_MS);
        if (Array.isArray(h.providers) && h.providers.includes(this.provider)) return new DaemonTransport(this.ep);
        why = new ProviderUnavailable(
          `roched on ${where(this.ep)} does not serve the ${this.provider} provider ` +
            `(it serves ${(h.providers ?? []).join(", ") || "none"})`,
        );
      } catch (e) {
        why = e instanceof RocheError ? e : new ProviderUnavailable(String(e));
      }
      // A roched whose certificate is not trusted is no reason to run elsewhere.
      if (this.choice === "daemon" || why instanceof TLSFailure) {
        throw why instanceof ProviderUnavailable ? why : new ProviderUnavailable(why.message);
      }
    }
    const path = findCLI(this.cliPath);
    if (!path) {
      throw new ProviderUnavailable(
        `provider unavailable: ${why ? why.message : 'transport "cli" was asked for'}, and no roche CLI was found: ` +
          "start roched (roche daemon start), put roche on PATH, or set ROCHE_CLI to its path",
      );
    }
    return new CLITransport(path);
  }

  /** @internal */
  deadline(): Deadline {
    return new Deadline(this.requestTimeout);
  }

  /**
   * Creates a sandbox. Every default is the safe one: no network, a read-only root with a
   * /tmp tmpfs, 300 s lifetime, 512m memory, 1 CPU, 64 processes. The sandbox is leased to
   * this process (`leased: false` to let it outlive it): destroyed within seconds of the
   * process's end, however it ends. Use `await using sb = await roche.create()` (or
   * `destroy()` in a `finally`) to destroy it as soon as you are done.
   */
  async create(o: CreateOptions = {}): Promise<Sandbox> {
    const cfg = makeConfig(o);
    const t = await this.resolve();
    return new Sandbox(this, t, await t.create(this.provider, cfg, this.deadline()));
  }

  /** A handle on an existing sandbox; SandboxNotFound when there is none. */
  async get(id: string): Promise<Sandbox> {
    const t = await this.resolve();
    return new Sandbox(this, t, await t.inspect(id, this.deadline()));
  }

  /** Brings back a sandbox paused to disk (`sandbox.pause({ toDisk: true })`), where it was:
   * its processes, code contexts and open files, with the lifetime it had left; resolves to a
   * handle on it. Also from another process or after a restart of roched, for a sandbox made
   * with `leased: false` (a leased one goes with the process that made it). Providers without
   * memory snapshots (all but vm's qemu) refuse it with Unsupported. */
  async resume(id: string): Promise<Sandbox> {
    const t = await this.resolve();
    return new Sandbox(this, t, await t.resume(id, this.deadline()));
  }

  /** Describes a sandbox, also one that ended within roched's --ended-retention (1 h by
   * default): its state is then "exited" and `end` says why it ended (oom, pids, lifetime,
   * lease_lost, destroyed and by whom, ...) with the evidence. SandboxNotFound for one never
   * known or forgotten; the CLI transport (direct mode) keeps no ends. */
  async inspect(id: string): Promise<SandboxInfo> {
    const t = await this.resolve();
    return t.inspectEnded(id, this.deadline());
  }

  /** This provider's sandboxes (a daemon's idle pooled ones are not listed): with
   * `metadata`, those created with every pair of it; with `state`, those "running",
   * "paused", "exited" or "created". */
  async list(o: ListOptions = {}): Promise<SandboxInfo[]> {
    return (await this.resolve()).list(this.provider, this.deadline(), checkListOptions(o));
  }

  /** Deletes a persistent workspace and its files; InUse while a sandbox has it mounted. */
  async deleteWorkspace(name: string): Promise<void> {
    await (await this.resolve()).deleteWorkspace(this.provider, name, this.deadline());
  }

  /** Stores `value` under `name` in roched's secret store (your tenant's), for sandboxes
   * created with `secrets: [{ name, hosts, fromStore: true }]`; setting it again rotates it:
   * every running sandbox that took it from the store sends the new value from its next
   * request on, without a restart. Resolves to those sandboxes' ids. With `sandbox` (an id or
   * a Sandbox), replaces the value of that running sandbox's secret only, stores nothing, and
   * resolves to its id. roched holds values in memory only (a restarted roched has none: set
   * them again); the value crosses roched's API, or the roche CLI's standard input (never its
   * command line). At most 64 KiB, no control characters (it goes in a header): else
   * InvalidConfig. */
  async setSecret(name: string, value: string, o: { sandbox?: string | Sandbox } = {}): Promise<string[]> {
    const sid = typeof o.sandbox === "string" ? o.sandbox : o.sandbox?.id;
    return (await this.resolve()).setSecret(name, value, sid, this.deadline());
  }

  /** Your stored secrets, never their values: when each was set, and the running sandboxes
   * that took it from the store. */
  async listSecrets(): Promise<StoredSecret[]> {
    return (await this.resolve()).listSecrets(this.deadline());
  }

  /** Takes a secret out of the store (SandboxNotFound, saying so, when it is not there).
   * Running sandboxes keep the value they have: destroy them, or `setSecret(name, other,
   * { sandbox })`, to revoke it there. */
  async removeSecret(name: string): Promise<void> {
    await (await this.resolve()).removeSecret(name, this.deadline());
  }

  /** Releases kept connections, and lets go of the sandboxes this Roche created leased (the
   * default), which are then destroyed within seconds. */
  async close(): Promise<void> {
    if (this.chosen) await (await this.chosen.catch(() => undefined))?.close();
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}

/** A sandbox. `await using` (or [Symbol.asyncDispose]()) destroys it. */
export class Sandbox {
  constructor(private readonly roche: Roche, private readonly t: Transport, public info: SandboxInfo) {}

  get id(): string {
    return this.info.id;
  }

  get provider(): string {
    return this.info.provider;
  }

  /** The sandbox's files, as its user (E2B's `sandbox.files`): read, write, list,
   * getInfo/stat, exists, makeDir, rename, remove and watchDir, content streamed both ways. */
  get files(): Files {
    return new Files(this.t, this.id, this.roche.requestTimeout);
  }

  /** Commands that belong to the sandbox, E2B's way: `sandbox.commands.run(cmd, { background:
   * true })` resolves to a handle (pid, wait, kill, sendStdin, closeStdin, disconnect);
   * `list()`, `connect(pid, { stdoutOffset, stderrOffset })`, `sendStdin`, `closeStdin`, `kill`
   * and `signal` reach any of them, also from another process, after a disconnect or a restart
   * of roched. */
  get commands(): Commands {
    return new Commands(this.t, this.id, this.roche.requestTimeout);
  }

  /** Terminals in this sandbox (through roched): `sandbox.pty.create({ cols, rows, cmd, onData })`
   * returns a handle with sendInput, resize, kill and wait. */
  get pty(): Pty {
    return new Pty(this.t, this.id, this.roche.requestTimeout);
  }

  private execDeadline(req: ExecRequest): Deadline {
    let run = req.timeout;
    if (run === undefined && this.info.expiresAt) run = Math.max(0, (this.info.expiresAt.getTime() - Date.now()) / 1000);
    return new Deadline(run === undefined ? undefined : run + this.roche.requestTimeout);
  }

  /** Runs a command and waits for it. `timeout` kills it (and all it started) after that many
   * seconds and sets `timedOut`. A non-zero exit is a result, not an error. */
  async exec(cmd: readonly string[], o: ExecOptions = {}): Promise<ExecResult> {
    const req = makeExecRequest(cmd, o);
    return this.t.exec(this.id, req, this.execDeadline(req));
  }

  /** Runs a command and yields its output as it is produced; `result` is set once the
   * iteration ends. Leaving the loop early (break, an exception) kills the command. */
  execStream(cmd: readonly string[], o: ExecOptions = {}): ExecStream {
    const req = makeExecRequest(cmd, o);
    return new ExecStream(this.t.execStream(this.id, req, this.execDeadline(req)));
  }

  /** Writes data to the absolute sandbox path, replacing it, creating parents. */
  async writeFile(path: string, data: string | Uint8Array, o: { mode?: number } = {}): Promise<void> {
    baseName(path, "path");
    const bytes = typeof data === "string" ? new TextEncoder().encode(data) : data;
    await this.t.writeFile(this.id, path, bytes, o.mode ?? 0o644, this.roche.deadline());
  }

  /** The content of a file in the sandbox. A file over maxBytes (default 1 GiB) throws
   * ResourceExhausted before any of it is read; a symlink, PermissionDenied. */
  async readFile(path: string, o: { maxBytes?: number } = {}): Promise<Uint8Array> {
    baseName(path, "path");
    return this.t.readFile(this.id, path, this.roche.deadline(), copyLimit(o.maxBytes));
  }

  /** The decisions of the sandbox's egress proxy (a sandbox made with `networkAllowlist`;
   * through roched), oldest first: every connection and plain HTTP request it allowed or
   * refused, the newest kept. */
  egressLog(): Promise<EgressDecision[]> {
    return this.t.egressLog(this.id, this.roche.deadline());
  }

  /** The minimal allowlist entries that would have allowed every refusal in the egress log
   * that an entry can allow (not one refused for its address). */
  egressSuggest(): Promise<string[]> {
    return this.t.egressSuggest(this.id, this.roche.deadline());
  }

  /** Adds entries ("pypi.org", "*.npmjs.org", "host:8443") to the sandbox's allowlist,
   * effective from its next connection; resolves to the allowlist then in force. */
  egressAllow(...entries: string[]): Promise<string[]> {
    return this.t.egressPolicy(this.id, entries, [], this.roche.deadline());
  }

  /** Takes entries out of the sandbox's allowlist, effective from its next connection (open
   * ones stay open); resolves to the allowlist. An entry it does not have is an error, and
   * changes nothing. */
  egressDeny(...entries: string[]): Promise<string[]> {
    return this.t.egressPolicy(this.id, [], entries, this.roche.deadline());
  }

  /**
   * Ends the sandbox `timeoutMs` milliseconds from now instead of when it was to end, sooner
   * or later (E2B's `setTimeout`, in milliseconds as there; rounded up to whole seconds): at
   * least 1 s, at most 24 h and, through roched, the tenant's maximum (InvalidConfig beyond
   * it). `info.expiresAt` takes the new end, which is also what ends the sandbox. A
   * kubernetes sandbox can be given more time only up to the end it was created with.
   */
  async setTimeout(timeoutMs: number): Promise<void> {
    if (typeof timeoutMs !== "number" || !(timeoutMs >= 1000)) {
      throw new InvalidConfig(`timeout ${JSON.stringify(timeoutMs)} ms: give milliseconds, at least 1000`);
    }
    this.info = await this.t.setTimeout(this.id, Math.ceil(timeoutMs / 1000), this.roche.deadline());
  }

  /** Freezes every process in the sandbox (`unpause` thaws them). With `{ toDisk: true }`
   * (E2B's pause) it saves the sandbox whole instead, memory, processes and code contexts
   * included, and stops it: it then holds no memory or CPU and its lifetime stops running
   * until `roche.resume(id)` (or `resume()`) brings it back where it was. To disk is the vm
   * provider's (qemu) only: others throw Unsupported, saying so in one line. */
  pause(o: { toDisk?: boolean } = {}): Promise<void> {
    if (o.toDisk) return this.t.pauseToDisk(this.id, this.roche.deadline());
    return this.t.pause(this.id, true, this.roche.deadline());
  }

  /** Brings this sandbox back from `pause({ toDisk: true })` (`Roche.resume`); `info` takes
   * its new description. Resolves to it. */
  async resume(): Promise<Sandbox> {
    this.info = await this.t.resume(this.id, this.roche.deadline());
    return this;
  }

  /** Makes `n` (1 to 64) new sandboxes, each a copy of this one as it is now (running, or
   * paused to disk), memory, processes and code contexts included, each with its own id,
   * randomness and whole lifetime; this one goes on as it was. The forks are not leased
   * (roched holds none for this process): destroy them (`await using`) or let their lifetime
   * end. The vm provider's (qemu) only: others throw Unsupported. */
  async fork(n = 1): Promise<Sandbox[]> {
    if (!Number.isInteger(n) || n < 1 || n > 64) throw new InvalidConfig(`fork(${JSON.stringify(n)}): give 1 to 64 forks`);
    const forks = await this.t.fork(this.id, n, this.roche.deadline());
    return forks.map((info) => new Sandbox(this.roche, this.t, info));
  }

  /** Thaws a paused sandbox. */
  unpause(): Promise<void> {
    return this.t.pause(this.id, false, this.roche.deadline());
  }

  /**
   * Runs a cell of code in a context, a long-lived interpreter that keeps its variables from
   * one call to the next, and returns its Execution (E2B's shape: `text`, `results`, `logs`,
   * `error`, `executionCount`). Without `context` the language's default context runs it
   * (python unless `language` says otherwise), started on first use. `timeoutMs` (300 s by
   * default) interrupts the cell, as KeyboardInterrupt: the context keeps its variables and
   * `timedOut` is set. An exception in the code is `error`, not thrown. The callbacks get
   * output as it is printed and results as they are produced (awaited when they return a
   * promise), and the error at the end.
   */
  async runCode(code: string, o: RunCodeOptions = {}): Promise<Execution> {
    const req = makeCodeRequest(code, o);
    const d = new Deadline((req.timeout ?? DEFAULT_CODE_TIMEOUT) + this.roche.requestTimeout);
    const seen = { results: 0 };
    let ex: Execution | undefined;
    for await (const item of this.t.runCode(this.id, req, d)) {
      await dispatch(item, o, seen);
      if (item instanceof Execution) ex = item;
    }
    if (!ex) throw new RocheError("the code stream ended without an execution");
    return ex;
  }

  /** Starts a new context (variables of its own) for runCode({context}); `language` defaults
   * to python, `cwd` to the sandbox's workdir. */
  createCodeContext(o: { language?: string; cwd?: string } = {}): Promise<Context> {
    return this.t.createContext(this.id, checkLanguage(o.language), o.cwd, this.roche.deadline());
  }

  /** The sandbox's contexts, the default ones included once started. */
  listCodeContexts(): Promise<Context[]> {
    return this.t.contexts(this.id, this.roche.deadline());
  }

  /** Replaces a context's interpreter with a fresh one: its variables go. */
  restartCodeContext(context: Context | string): Promise<void> {
    return this.t.restartContext(this.id, requireContext(context), this.roche.deadline());
  }

  /**
   * Starts a new context holding a copy of `context`'s interpreter (it forks itself):
   * the same variables, after which the two go on apart. Not on wasm.
   */
  forkCodeContext(context: Context | string): Promise<Context> {
    return this.t.forkContext(this.id, requireContext(context), this.roche.deadline());
  }

  /** Stops a context's interpreter and forgets it. */
  removeCodeContext(context: Context | string): Promise<void> {
    return this.t.removeContext(this.id, requireContext(context), this.roche.deadline());
  }

  /** Destroys the sandbox. Destroying one already gone is not an error. */
  destroy(): Promise<void> {
    return this.t.destroy(this.id, this.roche.deadline());
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.destroy();
  }
}

function requireContext(context: Context | string): string {
  const id = contextId(context);
  if (!id) throw new InvalidConfig("no context given: pass a Context from createCodeContext or listCodeContexts, or its id");
  return id;
}

/** A running command's output events; `result` is set when they end. */
export class ExecStream implements AsyncIterable<OutputEvent> {
  result: ExecResult | undefined;
  constructor(private readonly items: AsyncGenerator<StreamItem>) {}

  async *[Symbol.asyncIterator](): AsyncGenerator<OutputEvent> {
    try {
      for await (const item of this.items) {
        if ("exitCode" in item) this.result = item;
        else yield item;
      }
    } finally {
      await this.close();
    }
  }

  /** Reads the rest of the output and returns the result. */
  async wait(): Promise<ExecResult> {
    for await (const _ of this) {
      // drained
    }
    if (!this.result) throw new RocheError("the stream was closed before the command ended");
    return this.result;
  }

  /** Stops reading; a command still running is killed. */
  async close(): Promise<void> {
    await this.items.return(undefined);
  }
}
