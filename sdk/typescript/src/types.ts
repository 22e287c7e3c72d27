// The values the SDK takes and hands back, and the checks that make a mistake fail early with
// a hint (Roche itself validates the values).

import { InvalidConfig } from "./errors.js";

/** The image used when create() is given none and ROCHE_IMAGE is unset (as the CLI's). */
export const DEFAULT_IMAGE = "python:3.12-slim";
/** Each stream's output is kept up to this many bytes, then truncated and flagged. */
export const DEFAULT_OUTPUT_LIMIT = 10 << 20;
/** The most a readFile takes unless given maxBytes, as the CLI's and the Go API's. */
export const DEFAULT_COPY_MAX_BYTES = 1 << 30;

/** The outcome of a command. A non-zero exit, a timeout or an OOM kill are results. */
export interface ExecResult {
  stdout: string;
  stderr: string;
  exitCode: number;
  timedOut: boolean;
  truncated: boolean;
  oomKilled: boolean;
  /** Seconds the command ran. */
  duration: number;
  /** What it used (peak memory, CPU time, processes left running); undefined where the
   * provider cannot measure it (wasm, Docker's exec fallback). */
  receipt?: Receipt;
  /** The command exited 0 without timing out. */
  ok: boolean;
}

/** What a command used, measured by roche-agent in the sandbox. */
export interface Receipt {
  /** The largest resident set of any process of the command's tree (ru_maxrss). */
  peakMemoryBytes: number;
  /** Seconds of CPU (user plus system) the command's tree used. */
  cpuTime: number;
  /** Processes of its process group still running in the sandbox when it exited. */
  leftoverProcesses: number;
  /** Why the command ended or was cut when something other than the command did:
   * "command_timeout", "oom", "output_cap"; "" when it ended on its own. `evidence` is
   * what it was read from (docs/ended.md). */
  end: string;
  evidence: string;
}

/** Why and when a sandbox ended, with the evidence it was read from (docs/ended.md).
 * `kind` is one of: oom, pids, lifetime, command_timeout, output_cap, lease_lost,
 * destroyed, engine_gone, agent_exited, unknown. */
export interface EndReason {
  kind: string;
  at?: Date;
  detail: string;
  /** What the reason was read from, e.g. the cgroup's memory.events oom_kill. */
  evidence: string;
  /** Who destroyed it: "tenant:NAME", or a direct-mode sandbox's owner. */
  by: string;
  /** The sandbox's main process's exit status, when known. */
  exitCode?: number;
}

export function execResult(r: Omit<ExecResult, "ok">): ExecResult {
  return { ...r, ok: r.exitCode === 0 && !r.timedOut };
}

/** A piece of output, as the command produced it. */
export interface OutputEvent {
  stream: "stdout" | "stderr";
  data: Uint8Array;
  /** `data` decoded as UTF-8; characters split across events are decoded whole. */
  text: string;
  /** For a command's output (`sandbox.commands`): the byte offset of `data` in its stream,
   * counted from the command's start; the next piece starts at offset + data.length. */
  offset?: number;
}

/** Describes a sandbox. */
export interface SandboxInfo {
  id: string;
  provider: string;
  image: string;
  state: string;
  createdAt?: Date;
  expiresAt?: Date;
  /** Who made it: "roched:INSTANCE/TENANT" through roched, "cli:USER@HOST" directly. */
  owner: string;
  /** The key/value labels it was created with (`create({metadata})`). */
  metadata: Record<string, string>;
  /** Why it ended, for one that did (`Roche.inspect` of a sandbox that ended within
   * roched's --ended-retention); undefined while it runs. */
  end?: EndReason;
}

/** list()'s filter: the sandboxes created with every pair of `metadata`, in `state`. */
export interface ListOptions {
  metadata?: Record<string, string>;
  state?: "running" | "paused" | "exited" | "created";
}

const LIST_STATES = ["running", "paused", "exited", "created"];

/** Checks list()'s filter; Roche checks the keys themselves. */
export function checkListOptions(o: ListOptions): ListOptions {
  if (o.state !== undefined && !LIST_STATES.includes(o.state)) {
    throw new InvalidConfig(`state ${JSON.stringify(o.state)}: give one of ${LIST_STATES.join(", ")}`);
  }
  return { metadata: stringMap("metadata", o.metadata), state: o.state };
}

/** Binds a host path into the sandbox, read-only unless readWrite. */
/** One connection (a CONNECT tunnel or a plain HTTP request) a sandbox asked its egress
 * proxy for, and what the proxy did with it (`sandbox.egressLog()`). */
export interface EgressDecision {
  /** Numbers the proxy's decisions from 1. */
  seq: number;
  time?: Date;
  sandbox: string;
  tenant: string;
  host: string;
  port: number;
  /** The address resolved (and dialled when allowed). */
  addr: string;
  /** CONNECT, or the plain HTTP request's method; `path` is a plain request's. */
  method: string;
  path: string;
  /** The entry that allowed it, or that would have allowed a refusal for want of one. */
  rule: string;
  allowed: boolean;
  /** What the sandbox was told. */
  reason: string;
  /** Bytes to and from the upstream, filled in when an allowed connection ends (`done`). */
  bytesOut: number;
  bytesIn: number;
  done: boolean;
}

/** An EgressDecision as roched or `roche egress log --json` gives it. */
export function egressDecision(m: any): EgressDecision {
  const t = m.time;
  return {
    seq: Number(m.seq ?? 0),
    time: t instanceof Date ? t : typeof t === "string" ? new Date(t) : t ? new Date(Number(t.seconds) * 1000 + Math.floor((t.nanos ?? 0) / 1e6)) : undefined,
    sandbox: String(m.sandboxId ?? m.sandbox ?? ""),
    tenant: String(m.tenant ?? ""),
    host: String(m.host ?? ""),
    port: Number(m.port ?? 0),
    addr: String(m.addr ?? ""),
    method: String(m.method ?? ""),
    path: String(m.path ?? ""),
    rule: String(m.rule ?? ""),
    allowed: Boolean(m.allowed),
    reason: String(m.reason ?? ""),
    bytesOut: Number(m.bytesOut ?? m.bytes_out ?? 0),
    bytesIn: Number(m.bytesIn ?? m.bytes_in ?? 0),
    done: Boolean(m.done),
  };
}

/** A secret in roched's secret store (`roche.listSecrets()`): never its value. */
export interface StoredSecret {
  name: string;
  /** When it was last set. */
  updated?: Date;
  /** The running sandboxes that took it from the store (a `setSecret` rotates them). */
  sandboxes: string[];
}

/** A StoredSecret as roched (updatedAt, a Date) or `roche secret list --json` (updated) gives it. */
export function storedSecret(m: any): StoredSecret {
  const t = m.updatedAt ?? m.updated;
  return {
    name: String(m.name ?? ""),
    updated: t instanceof Date ? t : typeof t === "string" ? new Date(t) : undefined,
    sandboxes: [...(m.sandboxes ?? [])].map(String),
  };
}

export interface Mount {
  source: string;
  target: string;
  readWrite?: boolean;
}

/** create()'s options. Every default is the safe one; override what you need. */
export interface CreateOptions {
  /** Defaults to $ROCHE_IMAGE, else python:3.12-slim. */
  image?: string;
  /** Network access; off by default (only lo). */
  network?: boolean;
  /** A writable root filesystem; read-only by default (with a /tmp tmpfs). */
  writable?: boolean;
  /** The sandbox's lifetime in seconds (300); it is destroyed after. */
  timeoutSecs?: number;
  /** "512m" by default; a string such as "1g" or a number of bytes. */
  memory?: string | number;
  /** 1.0 by default. */
  cpus?: number;
  /** 64 by default. */
  pidsLimit?: number;
  env?: Record<string, string>;
  /** Mount objects or "HOST:SANDBOX[:ro|rw]" strings; read-only unless rw. */
  mounts?: Array<Mount | string>;
  workdir?: string;
  /** The user commands run as; by default a uid of the sandbox's own. */
  user?: string;
  /** Hosts reachable over HTTP(S) through roched's egress proxy, e.g. ["pypi.org"]. */
  networkAllowlist?: string[];
  /** A persistent workspace mounted at /workspace, made if new; it outlives the sandbox. */
  workspace?: string;
  /** Create from this snapshot's files instead of the image. */
  fromSnapshot?: string;
  /** What a writable root may hold ("1g" by default; "0" is no limit). */
  disk?: string | number;
  /** The size of a new workspace ("1g" when unset). */
  workspaceSize?: string | number;
  /** Tie the sandbox to this process (true by default): it is destroyed within seconds of
   * the process's end, however it ends. false: it lives until destroyed or its lifetime ends. */
  leased?: boolean;
  /** Key/value labels kept with the sandbox (E2B's `metadata`), returned in `info.metadata`
   * and by list(), which can select on them: at most 32 pairs, keys of letters, digits,
   * '_', '.' and '-' not starting with "roche" (Roche's own), values up to 512 bytes. */
  metadata?: Record<string, string>;
  /** Credentials the egress proxy brokers (see Secret); needs roched and a
   * `networkAllowlist` allowing their hosts. */
  secrets?: Secret[];
  /** Learn mode: the proxy allows only `networkAllowlist` (nothing without one), and
   * egressSuggest() names every entry the refusals needed. */
  egressLearn?: boolean;
}

/** A credential the egress proxy brokers: the sandbox's environment variable `name` holds
 * a placeholder, which the proxy replaces by the value in the headers of requests to
 * `hosts` (HOST[:PORT], 443 by default) only, and only in `header` if given. Give `value`,
 * or `fromStore: true` to take it from roched's secret store (`roche secret set NAME`),
 * whose rotation the sandbox then follows. */
export interface Secret {
  name: string;
  hosts: string[];
  value?: string;
  header?: string;
  fromStore?: boolean;
}

/** What to create, with every default filled in. */
export interface SandboxConfig {
  image: string;
  network: boolean;
  writable: boolean;
  timeoutSecs: number;
  memory: string;
  cpus: number;
  pidsLimit: number;
  env: Record<string, string>;
  mounts: Required<Mount>[];
  workdir?: string;
  user?: string;
  networkAllowlist: string[];
  workspace?: string;
  fromSnapshot?: string;
  disk: string;
  workspaceSize?: string;
  leased: boolean;
  metadata: Record<string, string>;
  secrets: Secret[];
  egressLearn: boolean;
}

/** Parses the CLI's HOST:SANDBOX[:ro|rw]. */
export function parseMount(spec: string): Required<Mount> {
  const parts = spec.split(":");
  if ((parts.length !== 2 && parts.length !== 3) || !parts[0] || !parts[1]) {
    throw new InvalidConfig(`mount ${JSON.stringify(spec)}: use HOST_PATH:SANDBOX_PATH[:ro|rw]`);
  }
  if (parts.length === 3 && parts[2] !== "ro" && parts[2] !== "rw") {
    throw new InvalidConfig(`mount ${JSON.stringify(spec)}: mode ${JSON.stringify(parts[2])} is neither ro nor rw`);
  }
  return { source: parts[0], target: parts[1], readWrite: parts[2] === "rw" };
}

export function mountString(m: Required<Mount>): string {
  return `${m.source}:${m.target}:${m.readWrite ? "rw" : "ro"}`;
}

function size(what: string, v: string | number): string {
  if (typeof v === "number" && Number.isInteger(v) && v >= 0) return String(v);
  if (typeof v === "string") return v;
  throw new InvalidConfig(`${what} ${JSON.stringify(v)}: give a size such as "1g" or a number of bytes`);
}

function stringMap(what: string, m: Record<string, string> | undefined): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(m ?? {})) {
    if (typeof v !== "string") {
      throw new InvalidConfig(`${what} ${k}=${JSON.stringify(v)}: names and values must be strings`);
    }
    out[k] = v;
  }
  return out;
}

export function makeConfig(o: CreateOptions = {}): SandboxConfig {
  const mounts = (o.mounts ?? []).map((m) => {
    if (typeof m === "string") return parseMount(m);
    if (m && typeof m.source === "string" && typeof m.target === "string") {
      return { source: m.source, target: m.target, readWrite: Boolean(m.readWrite) };
    }
    throw new InvalidConfig(`mount ${JSON.stringify(m)}: give {source, target, readWrite} or a "HOST:SANDBOX[:ro|rw]" string`);
  });
  return {
    image: o.image ?? (process.env.ROCHE_IMAGE || DEFAULT_IMAGE),
    network: Boolean(o.network),
    writable: Boolean(o.writable),
    timeoutSecs: o.timeoutSecs ?? 300,
    memory: size("memory", o.memory ?? "512m"),
    cpus: o.cpus ?? 1.0,
    pidsLimit: o.pidsLimit ?? 64,
    env: stringMap("env", o.env),
    mounts,
    workdir: o.workdir || undefined,
    user: o.user || undefined,
    networkAllowlist: [...(o.networkAllowlist ?? [])],
    workspace: o.workspace || undefined,
    fromSnapshot: o.fromSnapshot || undefined,
    disk: size("disk", o.disk ?? "1g"),
    workspaceSize: o.workspaceSize === undefined ? undefined : size("workspaceSize", o.workspaceSize),
    leased: o.leased ?? true,
    metadata: stringMap("metadata", o.metadata),
    secrets: (o.secrets ?? []).map((sec) => {
      if (!sec || typeof sec.name !== "string" || !Array.isArray(sec.hosts)) {
        throw new InvalidConfig(`secret ${JSON.stringify(sec?.name)}: give {name, hosts: [...], value or fromStore: true}`);
      }
      return { name: sec.name, hosts: [...sec.hosts], value: sec.value, header: sec.header, fromStore: Boolean(sec.fromStore) };
    }),
    egressLearn: Boolean(o.egressLearn),
  };
}

/** exec()'s options. */
export interface ExecOptions {
  /** Kills the command (and all it started) after this many seconds and sets timedOut;
   * unset means the sandbox's remaining lifetime. */
  timeout?: number;
  /** The command's whole standard input. */
  stdin?: string | Uint8Array;
  /** Added to the sandbox's environment for this command. */
  env?: Record<string, string>;
  workdir?: string;
  /** Stops waiting and kills the command when aborted (with an idempotencyKey, stops
   * waiting only: the command is the sandbox's). */
  signal?: AbortSignal;
  /** Makes the command the sandbox's rather than this call's (e.g. "build-42"): at most one
   * runs per key, a call whose connection to roched is lost (roched restarting, a replica
   * gone) is retried and joins it, and aborting the call leaves it running
   * (`commands.kill` stops it). */
  idempotencyKey?: string;
}

export interface ExecRequest {
  cmd: string[];
  timeout?: number;
  stdin?: Uint8Array;
  env: Record<string, string>;
  workdir?: string;
  signal?: AbortSignal;
  idempotencyKey?: string;
}

export function makeExecRequest(cmd: readonly string[], o: ExecOptions = {}): ExecRequest {
  if (typeof cmd === "string") {
    throw new InvalidConfig(
      `cmd ${JSON.stringify(cmd)} is a string: give the program and its arguments as an array, ` +
        `e.g. ["python3", "-c", "print(1)"] or ["sh", "-c", ${JSON.stringify(cmd)}]`,
    );
  }
  if (!Array.isArray(cmd) || cmd.length === 0) {
    throw new InvalidConfig('empty command: give the program and its arguments, e.g. ["python3", "-c", "print(1)"]');
  }
  if (!cmd.every((a) => typeof a === "string")) {
    throw new InvalidConfig(`cmd ${JSON.stringify(cmd)}: every argument must be a string`);
  }
  if (o.timeout !== undefined && !(o.timeout > 0)) {
    throw new InvalidConfig(`timeout ${o.timeout}: give seconds > 0, or leave it out for the sandbox's lifetime`);
  }
  if (o.idempotencyKey !== undefined && (typeof o.idempotencyKey !== "string" || o.idempotencyKey === "")) {
    throw new InvalidConfig(`idempotencyKey ${JSON.stringify(o.idempotencyKey)}: give a non-empty string, or leave it out`);
  }
  const stdin = typeof o.stdin === "string" ? new TextEncoder().encode(o.stdin) : o.stdin;
  return {
    cmd: [...cmd], timeout: o.timeout, stdin, env: stringMap("env", o.env), workdir: o.workdir || undefined, signal: o.signal,
    idempotencyKey: o.idempotencyKey,
  };
}

/** Checks a sandbox path for the files API: absolute, below /. Returns its base name. */
export function baseName(path: string, what: string): string {
  const parts = path.split("/").filter((p) => p !== "" && p !== ".");
  if (!path.startsWith("/") || parts.length === 0 || parts.includes("..")) {
    throw new InvalidConfig(`${what} ${JSON.stringify(path)} must be an absolute path below /, e.g. /tmp/data.txt`);
  }
  return parts[parts.length - 1];
}

export function copyLimit(maxBytes: number | undefined): number {
  if (maxBytes === undefined) return DEFAULT_COPY_MAX_BYTES;
  if (!Number.isInteger(maxBytes) || maxBytes <= 0) {
    throw new InvalidConfig(`maxBytes ${maxBytes} must be a positive number of bytes, e.g. 4 * 2 ** 30`);
  }
  return maxBytes;
}

/** Assembles output events: decodes characters split across pieces whole and keeps a
 * capped copy of each stream for the result. */
export class OutputAssembler {
  private kept = { stdout: [] as Uint8Array[], stderr: [] as Uint8Array[] };
  private keptBytes = { stdout: 0, stderr: 0 };
  private decoders = { stdout: new TextDecoder("utf-8"), stderr: new TextDecoder("utf-8") };
  truncated = false;

  output(stream: "stdout" | "stderr", data: Uint8Array): OutputEvent {
    const room = DEFAULT_OUTPUT_LIMIT - this.keptBytes[stream];
    if (data.length > room) this.truncated = true;
    if (room > 0) {
      const piece = data.subarray(0, room);
      this.kept[stream].push(piece);
      this.keptBytes[stream] += piece.length;
    }
    return { stream, data, text: this.decoders[stream].decode(data, { stream: true }) };
  }

  result(r: Omit<ExecResult, "ok" | "stdout" | "stderr">): ExecResult {
    const text = (s: "stdout" | "stderr") => new TextDecoder().decode(Buffer.concat(this.kept[s]));
    return execResult({ ...r, stdout: text("stdout"), stderr: text("stderr"), truncated: r.truncated || this.truncated });
  }
}
