// roched's API through connect-node: binary Connect protocol over HTTP/1.1, on the unix socket
// (kept connections) or on TCP with a bearer token.

import { create, fromBinary, type MessageInitShape } from "@bufbuild/protobuf";
import { BinaryReader, WireType } from "@bufbuild/protobuf/wire";
import { DurationSchema, timestampDate } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createClient, type Client, type Interceptor, type Transport as ConnectTransport } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { randomUUID } from "node:crypto";
import * as http from "node:http";
import * as https from "node:https";
import * as net from "node:net";
import * as tls from "node:tls";
import {
  CopyFromRequestSchema,
  CopyToRequestSchema,
  ErrorDetailSchema,
  ErrorReason,
  OutputStream,
  SandboxService,
  SandboxState,
  EndKind,
  type EndReason as WireEnd,
  type ReceiptUsage as WireReceipt,
  type CodeContext as WireContext,
  type CodeResult as WireCodeResult,
  type Sandbox as WireSandbox,
  type Command as WireCommand,
  type CommandEnd as WireCommandEnd,
  type SandboxConfigSchema,
} from "./gen/roche/v1/sandbox_pb.js";
import { CodeAssembler, Execution, makeResult, type CodeItem, type CodeRequest, type Context } from "./code.js";
import { Deadline } from "./deadline.js";
import { checkTraceparent, where, type Endpoint } from "./discovery.js";
import { errorFor, InvalidConfig, PermissionDenied, ProviderUnavailable, RocheError, SandboxNotFound, reasonFromText } from "./errors.js";
import { firstFile, fileTar } from "./tar.js";
import { entryFromWire, eventFromWire, FILE_CHUNK, IdleTimer, type EntryInfo, type FilesystemEvent } from "./files.js";
import { Backoff } from "./retry.js";
import { tlsProblem } from "./tls.js";
import { egressDecision, execResult, OutputAssembler, storedSecret, type StoredSecret, type EgressDecision, type EndReason, type ExecRequest, type ExecResult, type ListOptions, type OutputEvent, type Receipt, type SandboxConfig, type SandboxInfo } from "./types.js";
import type { StreamItem, Transport } from "./transport.js";
import type { PtyRequest } from "./pty.js";
import type { CommandEvent, CommandInfo, CommandRequest, CommandSelector } from "./commands.js";

/** Upload pieces of a tar stream this big, as the Go client does. */
const COPY_CHUNK = 32 << 10;
/** A Hold cut (roched restarting) is taken again for this long after it last answered. */
const HOLD_RETRY_FOR_MS = 30_000;
const HOLD_RETRY_DELAY_MS = 500;
/** roched sends a message on a Hold every 15 s: silence this long means a dead connection. */
const HOLD_SILENCE_MS = 45_000;

const REASONS: Record<number, string> = {
  [ErrorReason.NOT_FOUND]: "not_found",
  [ErrorReason.INVALID_CONFIG]: "invalid_config",
  [ErrorReason.UNAVAILABLE]: "unavailable",
  [ErrorReason.TIMEOUT]: "timeout",
  [ErrorReason.UNSUPPORTED]: "unsupported",
  [ErrorReason.IMAGE_NOT_FOUND]: "image_not_found",
  [ErrorReason.EXHAUSTED]: "exhausted",
  [ErrorReason.PERMISSION]: "permission_denied",
  [ErrorReason.IN_USE]: "in_use",
  [ErrorReason.NOT_CONFIGURED]: "unavailable", // a provider not set up here
  [ErrorReason.OUTPUT_GONE]: "output_gone",
};

const CODE_REASONS: Partial<Record<Code, string>> = {
  [Code.NotFound]: "not_found",
  [Code.InvalidArgument]: "invalid_config",
  [Code.Unavailable]: "unavailable",
  [Code.DeadlineExceeded]: "timeout",
  [Code.Unimplemented]: "unsupported",
  [Code.ResourceExhausted]: "exhausted",
  [Code.PermissionDenied]: "permission_denied",
  [Code.OutOfRange]: "output_gone",
};

function nodeErrorCode(e: unknown): string | undefined {
  for (let c: unknown = e; c && typeof c === "object"; c = (c as { cause?: unknown }).cause) {
    const code = (c as { code?: unknown }).code;
    if (typeof code === "string") return code;
  }
  return undefined;
}

/** The typed error for what a call to roched threw. */
export function errorFromConnect(e: unknown, ep: Endpoint): RocheError {
  if (e instanceof RocheError) return e;
  const err = ConnectError.from(e);
  const sysCode = nodeErrorCode(err.cause);
  const failure = tlsProblem(where(ep), sysCode, err.rawMessage);
  if (failure) return failure;
  if (sysCode === "ECONNREFUSED" || sysCode === "ENOENT" || sysCode === "ECONNRESET" || sysCode === "EPIPE") {
    // Refused (nobody listens) or broke (the connection cut midway): see retry.ts.
    return new ProviderUnavailable(
      `roched is not answering on ${where(ep)}: start it (roche daemon start), ` +
        `or let the SDK use the roche CLI (transport: "cli"): ${err.rawMessage}`,
      sysCode === "ECONNREFUSED" || sysCode === "ENOENT" ? "refused" : "broke",
    );
  }
  const message = err.rawMessage || Code[err.code];
  if (err.code === Code.Unauthenticated) {
    return new RocheError(`${message} (pass token or tokenFile, or set ROCHE_TOKEN or ROCHE_TOKEN_FILE)`, "unauthenticated");
  }
  let reason = "";
  for (const d of err.findDetails(ErrorDetailSchema)) reason ||= REASONS[d.reason] ?? "";
  reason ||= CODE_REASONS[err.code] ?? reasonFromText(message);
  return errorFor(reason, message, retryAfterOf(err));
}

/** The wait, in seconds, a google.rpc.RetryInfo detail suggests: its retry_delay (field 1),
 * a google.protobuf.Duration. The SDK has no generated type for RetryInfo; it reads the one
 * field. Undefined when there is none or it does not parse. */
export function retryAfterOf(err: ConnectError): number | undefined {
  for (const d of err.details) {
    if ("desc" in d || d.type !== "google.rpc.RetryInfo") continue;
    try {
      const r = new BinaryReader(d.value);
      while (r.pos < r.len) {
        const [field, wire] = r.tag();
        if (field === 1 && wire === WireType.LengthDelimited) {
          const dur = fromBinary(DurationSchema, r.bytes());
          const s = Number(dur.seconds) + dur.nanos / 1e9;
          return s > 0 ? s : undefined;
        }
        r.skip(wire);
      }
    } catch {
      // a malformed detail is no hint
    }
  }
  return undefined;
}

const STATES: Record<number, string> = {
  [SandboxState.RUNNING]: "running",
  [SandboxState.PAUSED]: "paused",
  [SandboxState.EXITED]: "exited",
  [SandboxState.CREATED]: "created",
};

export function sandboxInfo(s: WireSandbox | undefined): SandboxInfo {
  return {
    id: s?.id ?? "",
    provider: s?.provider ?? "",
    image: s?.image ?? "",
    state: STATES[s?.state ?? 0] ?? "exited",
    createdAt: s?.createdAt ? timestampDate(s.createdAt) : undefined,
    expiresAt: s?.expiresAt ? timestampDate(s.expiresAt) : undefined,
    owner: s?.owner ?? "",
    metadata: { ...(s?.metadata ?? {}) },
    end: endReason(s?.end),
  };
}

/** Why a sandbox ended, from its wire form; undefined for none. */
export function endReason(e: WireEnd | undefined): EndReason | undefined {
  if (!e) return undefined;
  const name = EndKind[e.kind] ?? "UNKNOWN";
  return {
    kind: name === "UNSPECIFIED" ? "unknown" : name.toLowerCase(),
    at: e.at ? timestampDate(e.at) : undefined,
    detail: e.detail,
    evidence: e.evidence,
    by: e.by,
    exitCode: e.exitKnown ? e.exitCode : undefined,
  };
}

/** A command's receipt, from its wire form; undefined for none. */
export function receipt(r: WireReceipt | undefined): Receipt | undefined {
  if (!r) return undefined;
  const d = r.cpuTime;
  return {
    peakMemoryBytes: Number(r.peakMemoryBytes),
    cpuTime: d ? Number(d.seconds) + d.nanos / 1e9 : 0,
    leftoverProcesses: r.leftoverProcesses,
    end: r.end === EndKind.UNSPECIFIED ? "" : (EndKind[r.end] ?? "UNKNOWN").toLowerCase(),
    evidence: r.evidence,
  };
}

function seconds(r: { duration?: { seconds: bigint; nanos: number } } | undefined): number {
  const d = r?.duration;
  return d ? Number(d.seconds) + d.nanos / 1e9 : 0;
}

function b64(b: Uint8Array): string | undefined {
  return b.length ? Buffer.from(b).toString("base64") : undefined;
}

function codeResult(w: WireCodeResult) {
  return makeResult({
    text: w.text, html: w.html, markdown: w.markdown, svg: w.svg, png: b64(w.png), jpeg: b64(w.jpeg),
    latex: w.latex, json: w.json, javascript: w.javascript, isMainResult: w.isMainResult,
  });
}

function codeContext(c: WireContext | undefined): Context {
  return { id: c?.id ?? "", language: c?.language ?? "", cwd: c?.cwd ?? "", default: c?.default ?? false };
}

function wireConfig(cfg: SandboxConfig): MessageInitShape<typeof SandboxConfigSchema> {
  // Every field is sent, so the daemon's defaults never replace the caller's.
  return {
    image: cfg.image,
    network: cfg.network,
    writable: cfg.writable,
    timeoutSecs: cfg.timeoutSecs,
    memory: cfg.memory,
    disk: cfg.disk,
    cpus: cfg.cpus,
    pidsLimit: cfg.pidsLimit,
    env: cfg.env,
    mounts: cfg.mounts,
    workdir: cfg.workdir ?? "",
    user: cfg.user,
    networkAllowlist: cfg.networkAllowlist,
    workspace: cfg.workspace ?? "",
    fromSnapshot: cfg.fromSnapshot ?? "",
    workspaceSize: cfg.workspaceSize ?? "",
    leased: cfg.leased,
    metadata: cfg.metadata,
    secrets: cfg.secrets.map((sec) => ({ name: sec.name, value: sec.value ?? "", hosts: sec.hosts, header: sec.header ?? "", fromStore: Boolean(sec.fromStore) })),
    egressLearn: cfg.egressLearn,
  };
}

function execInit(sid: string, req: ExecRequest) {
  return {
    sandboxId: sid,
    cmd: req.cmd,
    env: req.env,
    workdir: req.workdir ?? "",
    timeoutSecs: req.timeout ?? 0,
    stdin: req.stdin,
    idempotencyKey: req.idempotencyKey ?? "",
  };
}

/** A socket that does not keep the process alive: what holds a sandbox must not stop a
 * program from exiting (the sandbox then goes with it, as a lease should). */
function unrefConnection(ep: Endpoint): () => net.Socket {
  return () => {
    let s: net.Socket;
    if (ep.socket) {
      s = net.connect(ep.socket);
    } else {
      const u = new URL(ep.address!);
      const port = Number(u.port) || (u.protocol === "https:" ? 443 : 80);
      s = u.protocol === "https:"
        ? tls.connect({ host: u.hostname, port, servername: net.isIP(u.hostname) ? undefined : u.hostname, ...ep.tls })
        : net.connect(port, u.hostname);
    }
    s.unref();
    return s;
  };
}

function authInterceptor(token: string | undefined): Interceptor[] {
  if (!token) return [];
  return [(next) => async (req) => {
    req.header.set("Authorization", `Bearer ${token}`);
    return next(req);
  }];
}

/** Sends the endpoint's traceparent (docs/traces.md), a function's checked on each call. */
function traceInterceptor(tp: Endpoint["traceparent"]): Interceptor[] {
  if (!tp) return [];
  return [(next) => async (req) => {
    const v = typeof tp === "function" ? checkTraceparent(tp()) : tp;
    if (v) req.header.set("traceparent", v);
    return next(req);
  }];
}

function connectTransport(ep: Endpoint, hold: boolean): ConnectTransport {
  const nodeOptions: http.RequestOptions = hold
    ? { createConnection: unrefConnection(ep) as unknown as http.RequestOptions["createConnection"] }
    : ep.socket
      ? { socketPath: ep.socket, agent: new http.Agent({ keepAlive: true }) }
      : { agent: ep.address!.startsWith("https:") ? new https.Agent({ keepAlive: true, ...ep.tls }) : new http.Agent({ keepAlive: true }) };
  return createConnectTransport({
    baseUrl: ep.socket ? "http://roched" : ep.address!,
    httpVersion: "1.1",
    nodeOptions,
    interceptors: [...authInterceptor(ep.token), ...traceInterceptor(ep.traceparent)],
    // roched gzips a message of 32 KiB or more for a client that accepts it: on a local
    // socket that costs far more than it saves (as the Go client found: bench/commands).
    ...(ep.socket ? { acceptCompression: [] } : {}),
  });
}

/** GET /healthz within timeoutMs: roched's status and the providers it serves. */
export function health(ep: Endpoint, timeoutMs: number): Promise<{ providers?: string[] }> {
  return new Promise((resolve, reject) => {
    const unreachable = (why: string) =>
      new ProviderUnavailable(
        `roched is not answering on ${where(ep)}: start it (roche daemon start), or let the SDK use the roche CLI (transport: "cli"): ${why}`,
      );
    const opts: http.RequestOptions = ep.socket
      ? { socketPath: ep.socket, path: "/healthz", host: "roched" }
      : {};
    const url = ep.socket ? "http://roched/healthz" : `${ep.address}/healthz`;
    const get = url.startsWith("https:") ? https.get : http.get;
    const req = get(url, { ...opts, ...(ep.socket ? {} : ep.tls), timeout: timeoutMs }, (res) => {
      const body: Buffer[] = [];
      res.on("data", (b: Buffer) => body.push(b));
      res.on("end", () => {
        if (res.statusCode !== 200) {
          reject(new ProviderUnavailable(`roched on ${where(ep)} answered /healthz with HTTP ${res.statusCode}`));
          return;
        }
        try {
          resolve(JSON.parse(Buffer.concat(body).toString("utf8")));
        } catch (e) {
          reject(unreachable(String(e)));
        }
      });
      res.on("error", (e) => reject(unreachable(e.message)));
    });
    req.on("timeout", () => req.destroy(new Error(`no answer within ${timeoutMs} ms`)));
    req.on("error", (e) => reject(tlsProblem(where(ep), (e as NodeJS.ErrnoException).code, e.message) ?? unreachable(e.message)));
  });
}

/** Holds one leased sandbox with roched's Hold stream on a connection of its own, until
 * release() or the end of the process. A stream cut or refused (roched restarting), the
 * first one included, is taken again for HOLD_RETRY_FOR_MS; the hold ends for good when
 * roched says the sandbox is gone. */
class DaemonHold {
  private ctl = new AbortController();
  private done: Promise<void>;
  private held = false;
  ended = false;

  constructor(private client: Client<typeof SandboxService>, private ep: Endpoint, readonly sid: string) {
    let settle!: (err?: RocheError) => void;
    this.first = new Promise<RocheError | undefined>((r) => (settle = r));
    this.done = this.run(settle).finally(() => {
      this.ended = true;
    });
    void this.done;
  }

  /** Resolves once roched holds the sandbox (undefined), or with why it could not. */
  readonly first: Promise<RocheError | undefined>;

  release(): void {
    this.ctl.abort();
  }

  private async run(settle: (err?: RocheError) => void): Promise<void> {
    let last = Date.now();
    while (!this.ctl.signal.aborted) {
      let err: RocheError | undefined;
      const silence = new AbortController();
      const onStop = () => silence.abort();
      this.ctl.signal.addEventListener("abort", onStop, { once: true });
      let timer = setTimeout(() => silence.abort(), HOLD_SILENCE_MS);
      timer.unref();
      try {
        for await (const _ of this.client.hold({ sandboxId: this.sid }, { signal: silence.signal })) {
          last = Date.now();
          clearTimeout(timer);
          timer = setTimeout(() => silence.abort(), HOLD_SILENCE_MS);
          timer.unref();
          if (!this.held) {
            this.held = true;
            settle();
          }
        }
        err = new ProviderUnavailable(`roched on ${where(this.ep)} ended the Hold of sandbox ${this.sid}`);
      } catch (e) {
        err = errorFromConnect(e, this.ep);
      } finally {
        clearTimeout(timer);
        this.ctl.signal.removeEventListener("abort", onStop);
      }
      if (this.ctl.signal.aborted) break;
      // A connection lost before the first message is taken again too, as the Go client
      // does: the create just reached roched, so it is restarting, or a replica died
      // behind a Service that sends the next connection to another. An answer before the
      // first message (not a lost connection) fails at once.
      const lostFirst = !this.held && err instanceof ProviderUnavailable;
      if ((!this.held && !lostFirst) || err instanceof SandboxNotFound || err instanceof InvalidConfig || Date.now() - last > HOLD_RETRY_FOR_MS) {
        settle(err);
        return;
      }
      await new Promise((r) => setTimeout(r, HOLD_RETRY_DELAY_MS).unref());
    }
    settle(new RocheError(`the Hold of sandbox ${this.sid} was let go`));
  }
}

export class DaemonTransport implements Transport {
  readonly name = "daemon" as const;
  private client: Client<typeof SandboxService>;
  private holdClient: Client<typeof SandboxService>;
  private holds = new Map<string, DaemonHold>();
  private leases: Promise<Record<string, boolean>> | undefined;
  /** Whether roched has answered this transport: only then is one that does not listen
   * (restarting) waited for by a retry (retry.ts). */
  private reached = false;

  constructor(private ep: Endpoint) {
    this.client = createClient(SandboxService, connectTransport(ep, false));
    this.holdClient = createClient(SandboxService, connectTransport(ep, true));
  }

  /** Runs one call within d, turning what it throws into the SDK's typed errors. */
  private async call<T>(d: Deadline, what: string, fn: (signal: AbortSignal) => Promise<T>, outer?: AbortSignal): Promise<T> {
    const s = d.signal(outer);
    try {
      const v = await fn(s.signal);
      this.reached = true;
      return v;
    } catch (e) {
      if (s.timedOut()) throw d.expired(`roched on ${where(this.ep)} (${what})`);
      if (outer?.aborted) throw outer.reason;
      throw errorFromConnect(e, this.ep);
    } finally {
      s.dispose();
    }
  }

  /** call() for a call safe to repeat: a lost connection is tried again within d (retry.ts). */
  private async retrying<T>(d: Deadline, what: string, fn: (signal: AbortSignal) => Promise<T>, outer?: AbortSignal): Promise<T> {
    const backoff = new Backoff(d);
    for (;;) {
      try {
        return await this.call(d, what, fn, outer);
      } catch (e) {
        const wait = backoff.next(e, this.reached);
        if (wait === undefined || outer?.aborted) throw e;
        await new Promise((r) => setTimeout(r, wait));
      }
    }
  }

  private providerLeases(d: Deadline): Promise<Record<string, boolean>> {
    this.leases ??= this.retrying(d, "ListProviders", (signal) => this.client.listProviders({}, { signal })).then(
      (r) => Object.fromEntries(r.providers.map((p) => [p.name, Boolean(p.capabilities?.leases)])),
      (e) => {
        this.leases = undefined;
        throw e;
      },
    );
    return this.leases;
  }

  async create(provider: string, cfg: SandboxConfig, d: Deadline): Promise<SandboxInfo> {
    if (cfg.leased && !(await this.providerLeases(d))[provider]) {
      cfg = { ...cfg, leased: false }; // a roched without leases for it: as before them
    }
    // Every create has an idempotency key, so that one whose answer was lost is asked again:
    // roched answers the same key with the sandbox it made.
    const idempotencyKey = `sdk-${randomUUID()}`;
    const r = await this.retrying(d, "Create", (signal) => this.client.create({ provider, config: wireConfig(cfg), idempotencyKey }, { signal }));
    const info = sandboxInfo(r.sandbox);
    if (cfg.leased) await this.hold(info.id, d);
    return info;
  }

  /** Holds a leased sandbox just made; one that cannot be held is destroyed. */
  private async hold(sid: string, d: Deadline): Promise<void> {
    const h = new DaemonHold(this.holdClient, this.ep, sid);
    const left = d.remainingMs();
    let timer: NodeJS.Timeout | undefined;
    const err = await Promise.race([
      h.first,
      new Promise<RocheError>((r) => {
        timer = setTimeout(() => r(d.expired(`roched's Hold of sandbox ${sid}`)), Math.max(0, left ?? 2 ** 31 - 1));
      }),
    ]).finally(() => clearTimeout(timer));
    if (err) {
      h.release();
      await this.destroy(sid, new Deadline(20)).catch(() => undefined); // not held: roched destroys it shortly anyway
      throw err;
    }
    for (const [id, old] of this.holds) if (old.ended) this.holds.delete(id);
    this.holds.set(sid, h);
  }

  async exec(sid: string, req: ExecRequest, d: Deadline): Promise<ExecResult> {
    // With an idempotency key the command is the sandbox's: a retry joins it.
    const r = await (req.idempotencyKey !== undefined ? this.retrying.bind(this) : this.call.bind(this))(
      d, "Exec", (signal) => this.client.exec(execInit(sid, req), { signal }), req.signal);
    const w = r.result;
    const dec = (b: Uint8Array | undefined) => new TextDecoder().decode(b ?? new Uint8Array());
    return execResult({
      stdout: dec(w?.stdout),
      stderr: dec(w?.stderr),
      exitCode: w?.exitCode ?? 0,
      timedOut: w?.timedOut ?? false,
      truncated: w?.truncated ?? false,
      oomKilled: w?.oomKilled ?? false,
      duration: seconds(w),
      receipt: receipt(w?.receipt),
    });
  }

  async *execStream(sid: string, req: ExecRequest, d: Deadline): AsyncGenerator<StreamItem> {
    const s = d.signal(req.signal);
    const out = new OutputAssembler();
    let result: ExecResult | undefined;
    try {
      // Leaving this generator early aborts the call, which kills the command.
      for await (const m of this.client.execStream(execInit(sid, req), { signal: s.signal })) {
        const ev = m.event;
        if (ev.case === "output") {
          yield out.output(ev.value.stream === OutputStream.STDERR ? "stderr" : "stdout", ev.value.data) as OutputEvent;
        } else if (ev.case === "result") {
          const w = ev.value;
          result = out.result({
            exitCode: w.exitCode,
            timedOut: w.timedOut,
            truncated: w.truncated,
            oomKilled: w.oomKilled,
            duration: seconds(w),
            receipt: receipt(w.receipt),
          });
        }
      }
      // Read to the end of the stream before yielding the result: a response left unread
      // keeps its connection out of the pool, and that keeps Node running.
      if (!result) throw new RocheError("roched ended the output stream without a result");
      yield result;
    } catch (e) {
      if (s.timedOut()) throw d.expired(`roched on ${where(this.ep)} (ExecStream)`);
      if (req.signal?.aborted) throw req.signal.reason;
      throw errorFromConnect(e, this.ep);
    } finally {
      s.dispose();
    }
  }

  // PTY sessions (pty.ts): unary calls and one server stream, over HTTP/1.1 like the rest.

  async createPty(sid: string, req: PtyRequest, d: Deadline): Promise<number> {
    const r = await this.call(d, "CreatePty", (signal) =>
      this.client.createPty({ sandboxId: sid, cmd: req.cmd ?? [], env: req.env ?? {}, workdir: req.workdir ?? "", size: { cols: req.cols, rows: req.rows } }, { signal }));
    return r.pid;
  }

  /** The session's output, then its result; aborting signal stops reading (the session goes on). */
  async *connectPty(sid: string, pid: number, signal: AbortSignal): AsyncGenerator<Uint8Array | ExecResult> {
    try {
      for await (const m of this.client.connectPty({ sandboxId: sid, pid }, { signal })) {
        const ev = m.event;
        if (ev.case === "data") {
          yield ev.value;
        } else if (ev.case === "result") {
          const w = ev.value;
          yield execResult({ stdout: "", stderr: "", exitCode: w.exitCode, timedOut: w.timedOut, truncated: w.truncated, oomKilled: w.oomKilled, duration: seconds(w) });
          return;
        }
      }
      throw new RocheError("roched ended the terminal's output stream without a result");
    } catch (e) {
      if (signal.aborted) throw signal.reason;
      if (e instanceof RocheError) throw e;
      throw errorFromConnect(e, this.ep);
    }
  }

  async ptyInput(sid: string, pid: number, data: Uint8Array, d: Deadline): Promise<void> {
    await this.call(d, "SendPtyInput", (signal) => this.client.sendPtyInput({ sandboxId: sid, pid, data }, { signal }));
  }

  async ptyResize(sid: string, pid: number, cols: number, rows: number, d: Deadline): Promise<void> {
    await this.call(d, "ResizePty", (signal) => this.client.resizePty({ sandboxId: sid, pid, size: { cols, rows } }, { signal }));
  }

  async ptyKill(sid: string, pid: number, d: Deadline): Promise<void> {
    await this.call(d, "KillPty", (signal) => this.client.killPty({ sandboxId: sid, pid }, { signal }));
  }

  // Durable commands (commands.ts): unary calls and one server stream.

  async startCommand(sid: string, req: CommandRequest, d: Deadline): Promise<CommandInfo> {
    const r = await this.call(d, "StartCommand", (signal) =>
      this.client.startCommand({
        sandboxId: sid, cmd: req.argv, env: req.envs, workdir: req.cwd ?? "", timeoutSecs: req.timeout ?? 0, tag: req.tag ?? "",
        stdin: req.stdin, window: BigInt(req.window ?? 0), idempotencyKey: req.key ?? "",
      }, { signal }));
    if (!r.command) throw new RocheError("roched answered StartCommand without the command");
    return commandInfo(r.command);
  }

  async *connectCommand(sid: string, sel: CommandSelector, stdoutOffset: number, stderrOffset: number, signal: AbortSignal): AsyncGenerator<CommandEvent> {
    try {
      const init = { sandboxId: sid, command: wireSelector(sel), stdoutOffset: BigInt(stdoutOffset), stderrOffset: BigInt(stderrOffset) };
      for await (const m of this.client.connectCommand(init, { signal })) {
        const ev = m.event;
        if (ev.case === "start") {
          yield { kind: "start", pid: ev.value.pid, tag: ev.value.tag || undefined, stdoutOffset: Number(ev.value.stdoutOffset), stderrOffset: Number(ev.value.stderrOffset) };
        } else if (ev.case === "data") {
          yield { kind: "data", stream: ev.value.stream === OutputStream.STDERR ? "stderr" : "stdout", offset: Number(ev.value.offset), data: ev.value.data };
        } else if (ev.case === "end") {
          yield commandEnd(ev.value);
          return;
        }
      }
      throw new RocheError("roched ended the command's stream without its end");
    } catch (e) {
      if (signal.aborted) throw signal.reason;
      if (e instanceof RocheError) throw e;
      throw errorFromConnect(e, this.ep);
    }
  }

  async listCommands(sid: string, d: Deadline): Promise<CommandInfo[]> {
    const r = await this.retrying(d, "ListCommands", (signal) => this.client.listCommands({ sandboxId: sid }, { signal }));
    return r.commands.map(commandInfo);
  }

  async sendCommandInput(sid: string, sel: CommandSelector, data: Uint8Array, d: Deadline): Promise<void> {
    await this.call(d, "SendCommandInput", (signal) => this.client.sendCommandInput({ sandboxId: sid, command: wireSelector(sel), data }, { signal }));
  }

  async closeCommandInput(sid: string, sel: CommandSelector, d: Deadline): Promise<void> {
    await this.call(d, "CloseCommandInput", (signal) => this.client.closeCommandInput({ sandboxId: sid, command: wireSelector(sel) }, { signal }));
  }

  async signalCommand(sid: string, sel: CommandSelector, sig: number, d: Deadline): Promise<void> {
    await this.call(d, "SignalCommand", (signal) => this.client.signalCommand({ sandboxId: sid, command: wireSelector(sel), signal: sig }, { signal }));
  }

  async destroy(sid: string, d: Deadline): Promise<void> {
    try {
      await this.retrying(d, "Destroy", (signal) => this.client.destroy({ ids: [sid] }, { signal }));
    } catch (e) {
      if (!(e instanceof SandboxNotFound)) throw e; // roched serves no such sandbox (any more): idempotent
    } finally {
      // Let go after the Destroy: one that failed still ends, when the hold does.
      this.holds.get(sid)?.release();
      this.holds.delete(sid);
    }
  }

  async inspect(sid: string, d: Deadline): Promise<SandboxInfo> {
    const r = await this.retrying(d, "Inspect", (signal) => this.client.inspect({ sandboxId: sid }, { signal }));
    return sandboxInfo(r.sandbox);
  }

  async inspectEnded(sid: string, d: Deadline): Promise<SandboxInfo> {
    const r = await this.retrying(d, "Inspect", (signal) => this.client.inspect({ sandboxId: sid, includeEnded: true }, { signal }));
    return sandboxInfo(r.sandbox);
  }

  async list(provider: string, d: Deadline, o: ListOptions = {}): Promise<SandboxInfo[]> {
    const state = o.state ? (Object.entries(STATES).find(([, v]) => v === o.state)?.[0] ?? 0) : 0;
    const r = await this.retrying(d, "List", (signal) =>
      this.client.list({ provider, metadata: o.metadata ?? {}, state: Number(state) }, { signal }),
    );
    return r.sandboxes.map(sandboxInfo);
  }

  async setTimeout(sid: string, timeoutSecs: number, d: Deadline): Promise<SandboxInfo> {
    const r = await this.call(d, "SetTimeout", (signal) => this.client.setTimeout({ sandboxId: sid, timeoutSecs }, { signal }));
    return sandboxInfo(r.sandbox);
  }

  async pause(sid: string, pause: boolean, d: Deadline): Promise<void> {
    await this.call(d, pause ? "Pause" : "Unpause", async (signal) => {
      if (pause) await this.client.pause({ sandboxId: sid }, { signal });
      else await this.client.unpause({ sandboxId: sid }, { signal });
    });
  }

  async pauseToDisk(sid: string, d: Deadline): Promise<void> {
    await this.call(d, "Pause", (signal) => this.client.pause({ sandboxId: sid, toDisk: true }, { signal }));
  }

  async resume(sid: string, d: Deadline): Promise<SandboxInfo> {
    const r = await this.call(d, "Resume", (signal) => this.client.resume({ sandboxId: sid }, { signal }));
    return sandboxInfo(r.sandbox);
  }

  async fork(sid: string, count: number, d: Deadline): Promise<SandboxInfo[]> {
    const r = await this.call(d, "Fork", (signal) => this.client.fork({ sandboxId: sid, count }, { signal }));
    return r.sandboxes.map(sandboxInfo);
  }

  async writeFile(sid: string, path: string, data: Uint8Array, mode: number, d: Deadline): Promise<void> {
    const name = path.split("/").filter(Boolean).pop()!;
    const tar = fileTar(name, data, mode);
    async function* messages() {
      for (let i = 0; i === 0 || i < tar.length; i += COPY_CHUNK) {
        const init: MessageInitShape<typeof CopyToRequestSchema> = { tarChunk: tar.subarray(i, i + COPY_CHUNK) };
        if (i === 0) Object.assign(init, { sandboxId: sid, dst: path });
        yield create(CopyToRequestSchema, init);
      }
    }
    await this.call(d, "CopyTo", (signal) => this.client.copyTo(messages(), { signal }));
  }

  async readFile(sid: string, path: string, d: Deadline, maxBytes: number): Promise<Uint8Array> {
    const trailer = new Headers();
    const got = await this.call(d, "CopyFrom", async (signal) => {
      const chunks = async function* (stream: AsyncIterable<{ tarChunk: Uint8Array }>) {
        for await (const m of stream) yield m.tarChunk;
      };
      const req = create(CopyFromRequestSchema, { sandboxId: sid, src: path, maxBytes: BigInt(maxBytes) });
      return firstFile(chunks(this.client.copyFrom(req, { signal, onTrailer: (t) => t.forEach((v, k) => trailer.set(k, v)) })), path, maxBytes);
    });
    if (got === undefined) {
      if (Number(trailer.get("roche-skipped-links") ?? 0) > 0) {
        throw new PermissionDenied(`permission denied: ${path} is a symlink, which the files API does not follow`);
      }
      throw new RocheError(`reading ${path}: the sandbox sent an empty archive`);
    }
    return got;
  }

  // The files API (sandbox.files), streamed both ways in binary protobuf.

  /** A call of the files API that streams: its errors typed, the idle limit's its own. */
  private async *filesCall<T>(idle: IdleTimer, what: string, it: AsyncIterable<T>): AsyncGenerator<T> {
    try {
      for await (const m of it) {
        idle.touch();
        yield m;
      }
    } catch (e) {
      const t = idle.timedOut();
      if (t) throw t;
      if (idle.signal.aborted && idle.signal.reason instanceof RocheError) throw idle.signal.reason;
      throw errorFromConnect(e, this.ep);
    } finally {
      idle.dispose();
    }
  }

  async *fileRead(sid: string, path: string, maxBytes: number, idleMs: number): AsyncGenerator<EntryInfo | Uint8Array> {
    const idle = new IdleTimer(idleMs, `roched on ${where(this.ep)} (ReadFile)`);
    try {
      const stream = this.client.readFile({ sandboxId: sid, path, maxBytes: BigInt(maxBytes) }, { signal: idle.signal });
      for await (const m of this.filesCall(idle, "ReadFile", stream)) {
        if (m.entry) yield entryFromWire(m.entry);
        if (m.data.length) yield m.data;
      }
    } finally {
      idle.abort(); // left early: the read ends
    }
  }

  async fileWrite(sid: string, path: string, content: AsyncIterable<Uint8Array>, mode: number, maxBytes: number, idleMs: number): Promise<EntryInfo> {
    const idle = new IdleTimer(idleMs, `roched on ${where(this.ep)} (WriteFile)`);
    async function* messages() {
      let first = true;
      let buf: Uint8Array[] = [];
      let n = 0;
      const flush = () => {
        const data = buf.length === 1 ? buf[0] : Buffer.concat(buf);
        buf = [];
        n = 0;
        const m = first ? { sandboxId: sid, path, mode, maxBytes: BigInt(maxBytes), data } : { data };
        first = false;
        return m;
      };
      for await (let piece of content) {
        idle.touch();
        while (piece.length) {
          const take = piece.subarray(0, FILE_CHUNK - n);
          piece = piece.subarray(take.length);
          buf.push(take);
          n += take.length;
          if (n === FILE_CHUNK) yield flush();
        }
      }
      if (n || first) yield flush();
    }
    try {
      const r = await this.client.writeFile(messages(), { signal: idle.signal });
      return entryFromWire(r.entry);
    } catch (e) {
      const t = idle.timedOut();
      if (t) throw t;
      throw errorFromConnect(e, this.ep);
    } finally {
      idle.dispose();
    }
  }

  async fileList(sid: string, path: string, depth: number, ms: number): Promise<EntryInfo[]> {
    const r = await this.call(new Deadline(ms / 1000), "ListDir", (signal) => this.client.listDir({ sandboxId: sid, path, depth }, { signal }));
    return r.entries.map(entryFromWire);
  }

  async fileStat(sid: string, path: string, missingOk: boolean, ms: number): Promise<EntryInfo | undefined> {
    const r = await this.call(new Deadline(ms / 1000), "Stat", (signal) => this.client.stat({ sandboxId: sid, path, missingOk }, { signal }));
    if (missingOk && !r.exists) return undefined;
    return entryFromWire(r.entry);
  }

  async fileMkdir(sid: string, path: string, ms: number): Promise<boolean> {
    const r = await this.call(new Deadline(ms / 1000), "MakeDir", (signal) => this.client.makeDir({ sandboxId: sid, path }, { signal }));
    return r.created;
  }

  async fileRename(sid: string, oldPath: string, newPath: string, ms: number): Promise<EntryInfo> {
    const r = await this.call(new Deadline(ms / 1000), "Rename", (signal) =>
      this.client.rename({ sandboxId: sid, source: oldPath, destination: newPath }, { signal }));
    return entryFromWire(r.entry);
  }

  async fileRemove(sid: string, path: string, ms: number): Promise<void> {
    await this.call(new Deadline(ms / 1000), "Remove", (signal) => this.client.remove({ sandboxId: sid, path }, { signal }));
  }

  async *fileWatch(sid: string, path: string, recursive: boolean, idleMs: number, signal: AbortSignal): AsyncGenerator<FilesystemEvent | undefined> {
    // roched sends a heartbeat every few seconds while the directory is quiet.
    const idle = new IdleTimer(idleMs, `roched on ${where(this.ep)} (WatchDir)`, signal);
    try {
      const stream = this.client.watchDir({ sandboxId: sid, path, recursive }, { signal: idle.signal });
      for await (const m of this.filesCall(idle, "WatchDir", stream)) {
        if (m.event.case === "started") yield undefined;
        else if (m.event.case === "file") {
          const ev = eventFromWire(m.event.value);
          if (ev) yield ev;
        }
      }
    } finally {
      idle.abort();
    }
  }

  async *runCode(sid: string, req: CodeRequest, d: Deadline): AsyncGenerator<CodeItem> {
    const s = d.signal(req.signal);
    const asm = new CodeAssembler();
    let ex: Execution | undefined;
    const init = { sandboxId: sid, code: req.code, language: req.language, contextId: req.context, timeoutSecs: req.timeout ?? 0 };
    try {
      // Leaving this generator early aborts the call, which interrupts the cell.
      for await (const m of this.client.runCode(init, { signal: s.signal })) {
        const ev = m.event;
        if (ev.case === "output") {
          const msg = asm.output(ev.value.stream === OutputStream.STDERR ? "stderr" : "stdout", ev.value.data);
          if (msg) yield msg;
        } else if (ev.case === "result") {
          yield asm.result(codeResult(ev.value));
        } else if (ev.case === "execution") {
          const w = ev.value;
          ex = new Execution();
          ex.results = asm.results;
          ex.logs = asm.logs;
          if (w.error) ex.error = { name: w.error.name, value: w.error.value, traceback: w.error.traceback };
          ex.executionCount = w.executionCount;
          ex.context = w.contextId;
          ex.timedOut = w.timedOut;
          ex.restarted = w.restarted;
          ex.truncated = w.truncated || asm.truncated;
          ex.duration = w.duration ? Number(w.duration.seconds) + w.duration.nanos / 1e9 : 0;
        }
      }
      // Read to the end of the stream first, as execStream does, so the connection is reused.
      if (!ex) throw new RocheError("roched ended the code stream without an execution");
      yield ex;
    } catch (e) {
      if (s.timedOut()) throw d.expired(`roched on ${where(this.ep)} (RunCode)`);
      if (req.signal?.aborted) throw req.signal.reason;
      throw errorFromConnect(e, this.ep);
    } finally {
      s.dispose();
    }
  }

  async createContext(sid: string, language: string, cwd: string | undefined, d: Deadline): Promise<Context> {
    const r = await this.call(d, "CreateContext", (signal) => this.client.createContext({ sandboxId: sid, language, cwd: cwd ?? "" }, { signal }));
    return codeContext(r.context);
  }

  async contexts(sid: string, d: Deadline): Promise<Context[]> {
    const r = await this.retrying(d, "ListContexts", (signal) => this.client.listContexts({ sandboxId: sid }, { signal }));
    return r.contexts.map(codeContext);
  }

  async restartContext(sid: string, cid: string, d: Deadline): Promise<void> {
    await this.call(d, "RestartContext", (signal) => this.client.restartContext({ sandboxId: sid, contextId: cid }, { signal }));
  }

  async forkContext(sid: string, cid: string, d: Deadline): Promise<Context> {
    const r = await this.call(d, "ForkContext", (signal) => this.client.forkContext({ sandboxId: sid, contextId: cid }, { signal }));
    return codeContext(r.context);
  }

  async removeContext(sid: string, cid: string, d: Deadline): Promise<void> {
    await this.call(d, "RemoveContext", (signal) => this.client.removeContext({ sandboxId: sid, contextId: cid }, { signal }));
  }

  async egressLog(sid: string, d: Deadline): Promise<EgressDecision[]> {
    const r = await this.call(d, "EgressLog", (signal) => this.client.egressLog({ sandboxId: sid }, { signal }));
    return r.decisions.map((m) => egressDecision({ ...m, time: m.time ? timestampDate(m.time) : undefined }));
  }

  async egressSuggest(sid: string, d: Deadline): Promise<string[]> {
    const r = await this.call(d, "EgressLog", (signal) => this.client.egressLog({ sandboxId: sid }, { signal }));
    return [...r.suggested];
  }

  async egressPolicy(sid: string, allow: string[], remove: string[], d: Deadline): Promise<string[]> {
    const r = await this.call(d, "EgressPolicy", (signal) => this.client.egressPolicy({ sandboxId: sid, allow, remove }, { signal }));
    return [...r.rules];
  }

  async setSecret(name: string, value: string, sandbox: string | undefined, d: Deadline): Promise<string[]> {
    const r = await this.call(d, "SetSecret", (signal) => this.client.setSecret({ name, value, sandboxId: sandbox ?? "" }, { signal }));
    return [...r.rotated];
  }

  async listSecrets(d: Deadline): Promise<StoredSecret[]> {
    const r = await this.call(d, "ListSecrets", (signal) => this.client.listSecrets({}, { signal }));
    return r.secrets.map((s) => storedSecret({ ...s, updatedAt: s.updatedAt ? timestampDate(s.updatedAt) : undefined }));
  }

  async removeSecret(name: string, d: Deadline): Promise<void> {
    await this.call(d, "RemoveSecret", (signal) => this.client.removeSecret({ name }, { signal }));
  }

  async deleteWorkspace(provider: string, name: string, d: Deadline): Promise<void> {
    await this.call(d, "RemoveWorkspace", (signal) => this.client.removeWorkspace({ name, provider }, { signal }));
  }

  async close(): Promise<void> {
    for (const h of this.holds.values()) h.release();
    this.holds.clear();
  }
}

function wireSelector(sel: CommandSelector): { selector: { case: "pid"; value: number } | { case: "tag"; value: string } } {
  return "tag" in sel ? { selector: { case: "tag", value: sel.tag } } : { selector: { case: "pid", value: sel.pid } };
}

/** A CommandEnd; a missing one is an unknown exit status, never exit 0. */
function commandEnd(e: WireCommandEnd | undefined): Extract<CommandEvent, { kind: "end" }> {
  if (!e) return { kind: "end", exitCode: -1, signal: 0, timedOut: false, oomKilled: false, duration: 0, unknown: "roched sent no end" };
  return { kind: "end", exitCode: e.exitCode, signal: e.signal, timedOut: e.timedOut, oomKilled: e.oomKilled, duration: seconds(e), unknown: e.unknown };
}

function commandInfo(c: WireCommand): CommandInfo {
  const end = c.end ? commandEnd(c.end) : undefined;
  return {
    pid: c.pid, tag: c.tag || undefined, argv: [...c.cmd], cmd: c.cmd[0] ?? "", args: c.cmd.slice(1), envs: { ...c.env }, cwd: c.workdir,
    running: c.running, stdin: c.stdin, pty: c.tty, startedAt: c.startedAt ? timestampDate(c.startedAt) : undefined,
    window: Number(c.window), firstStdout: Number(c.first?.stdout ?? 0n), firstStderr: Number(c.first?.stderr ?? 0n),
    stdoutBytes: Number(c.written?.stdout ?? 0n), stderrBytes: Number(c.written?.stderr ?? 0n),
    exitCode: end?.exitCode, signal: end?.signal ?? 0, unknown: end?.unknown ?? "",
  };
}
