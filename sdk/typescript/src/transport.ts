// What a Sandbox needs from its way to Roche: roched (daemon.ts) or the roche CLI (cli.ts).
// Both offer the same calls and throw the same typed errors.

import type { CodeItem, CodeRequest, Context } from "./code.js";
import type { CommandEvent, CommandInfo, CommandRequest, CommandSelector } from "./commands.js";
import type { Deadline } from "./deadline.js";
import type { EntryInfo, FilesystemEvent } from "./files.js";
import type { EgressDecision, ExecRequest, ExecResult, ListOptions, OutputEvent, SandboxConfig, SandboxInfo, StoredSecret } from "./types.js";

export type StreamItem = OutputEvent | ExecResult;

export interface Transport {
  readonly name: "daemon" | "cli";
  create(provider: string, cfg: SandboxConfig, d: Deadline): Promise<SandboxInfo>;
  exec(sid: string, req: ExecRequest, d: Deadline): Promise<ExecResult>;
  /** Output events as the command produces them, then its result. */
  execStream(sid: string, req: ExecRequest, d: Deadline): AsyncGenerator<StreamItem>;
  destroy(sid: string, d: Deadline): Promise<void>;
  inspect(sid: string, d: Deadline): Promise<SandboxInfo>;
  /** inspect, and of a sandbox that ended within roched's --ended-retention, why. */
  inspectEnded(sid: string, d: Deadline): Promise<SandboxInfo>;
  list(provider: string, d: Deadline, o?: ListOptions): Promise<SandboxInfo[]>;
  setTimeout(sid: string, timeoutSecs: number, d: Deadline): Promise<SandboxInfo>;
  pause(sid: string, pause: boolean, d: Deadline): Promise<void>;
  // Memory snapshots (providers that have them: vm's qemu).
  pauseToDisk(sid: string, d: Deadline): Promise<void>;
  resume(sid: string, d: Deadline): Promise<SandboxInfo>;
  fork(sid: string, count: number, d: Deadline): Promise<SandboxInfo[]>;
  writeFile(sid: string, path: string, data: Uint8Array, mode: number, d: Deadline): Promise<void>;
  readFile(sid: string, path: string, d: Deadline, maxBytes: number): Promise<Uint8Array>;
  deleteWorkspace(provider: string, name: string, d: Deadline): Promise<void>;
  /** A cell's output and results as the context produces them, then its Execution. */
  runCode(sid: string, req: CodeRequest, d: Deadline): AsyncGenerator<CodeItem>;
  createContext(sid: string, language: string, cwd: string | undefined, d: Deadline): Promise<Context>;
  contexts(sid: string, d: Deadline): Promise<Context[]>;
  restartContext(sid: string, cid: string, d: Deadline): Promise<void>;
  removeContext(sid: string, cid: string, d: Deadline): Promise<void>;
  forkContext(sid: string, cid: string, d: Deadline): Promise<Context>;
  // The egress proxy of a sandbox with an allowlist (roched's).
  egressLog(sid: string, d: Deadline): Promise<EgressDecision[]>;
  egressSuggest(sid: string, d: Deadline): Promise<string[]>;
  egressPolicy(sid: string, allow: string[], remove: string[], d: Deadline): Promise<string[]>;
  // roched's secret store (through the CLI too: it asks roched).
  setSecret(name: string, value: string, sandbox: string | undefined, d: Deadline): Promise<string[]>;
  listSecrets(d: Deadline): Promise<StoredSecret[]>;
  removeSecret(name: string, d: Deadline): Promise<void>;
  // The files API (sandbox.files). Streams take an idle limit in milliseconds.
  /** The file's entry (through roched), then its content as it arrives. */
  fileRead(sid: string, path: string, maxBytes: number, idleMs: number): AsyncGenerator<EntryInfo | Uint8Array>;
  fileWrite(sid: string, path: string, content: AsyncIterable<Uint8Array>, mode: number, maxBytes: number, idleMs: number): Promise<EntryInfo>;
  fileList(sid: string, path: string, depth: number, ms: number): Promise<EntryInfo[]>;
  /** undefined for a missing path when missingOk (an unknown sandbox still throws). */
  fileStat(sid: string, path: string, missingOk: boolean, ms: number): Promise<EntryInfo | undefined>;
  fileMkdir(sid: string, path: string, ms: number): Promise<boolean>;
  fileRename(sid: string, oldPath: string, newPath: string, ms: number): Promise<EntryInfo>;
  fileRemove(sid: string, path: string, ms: number): Promise<void>;
  /** undefined once the watch is in place, then its events, until signal aborts. */
  fileWatch(sid: string, path: string, recursive: boolean, idleMs: number, signal: AbortSignal): AsyncGenerator<FilesystemEvent | undefined>;
  /** Durable commands (commands.ts). */
  startCommand(sid: string, req: CommandRequest, d: Deadline): Promise<CommandInfo>;
  /** A command's start, its output from the offsets given, and its end; aborting signal
   * stops reading (the command goes on). */
  connectCommand(sid: string, sel: CommandSelector, stdoutOffset: number, stderrOffset: number, signal: AbortSignal): AsyncGenerator<CommandEvent>;
  listCommands(sid: string, d: Deadline): Promise<CommandInfo[]>;
  sendCommandInput(sid: string, sel: CommandSelector, data: Uint8Array, d: Deadline): Promise<void>;
  closeCommandInput(sid: string, sel: CommandSelector, d: Deadline): Promise<void>;
  signalCommand(sid: string, sel: CommandSelector, sig: number, d: Deadline): Promise<void>;
  /** Lets go of the sandboxes held (leased ones are then destroyed within seconds). */
  close(): Promise<void>;
}
