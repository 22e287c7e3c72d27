// What a Sandbox needs from its way to Roche: roched (daemon.ts) or the roche CLI (cli.ts).
// Both offer the same calls and throw the same typed errors.

import type { CodeItem, CodeRequest, Context } from "./code.js";
import type { Deadline } from "./deadline.js";
import type { ExecRequest, ExecResult, OutputEvent, SandboxConfig, SandboxInfo } from "./types.js";

export type StreamItem = OutputEvent | ExecResult;

export interface Transport {
  readonly name: "daemon" | "cli";
  create(provider: string, cfg: SandboxConfig, d: Deadline): Promise<SandboxInfo>;
  exec(sid: string, req: ExecRequest, d: Deadline): Promise<ExecResult>;
  /** Output events as the command produces them, then its result. */
  execStream(sid: string, req: ExecRequest, d: Deadline): AsyncGenerator<StreamItem>;
  destroy(sid: string, d: Deadline): Promise<void>;
  inspect(sid: string, d: Deadline): Promise<SandboxInfo>;
  list(provider: string, d: Deadline): Promise<SandboxInfo[]>;
  pause(sid: string, pause: boolean, d: Deadline): Promise<void>;
  writeFile(sid: string, path: string, data: Uint8Array, mode: number, d: Deadline): Promise<void>;
  readFile(sid: string, path: string, d: Deadline, maxBytes: number): Promise<Uint8Array>;
  deleteWorkspace(provider: string, name: string, d: Deadline): Promise<void>;
  /** A cell's output and results as the context produces them, then its Execution. */
  runCode(sid: string, req: CodeRequest, d: Deadline): AsyncGenerator<CodeItem>;
  createContext(sid: string, language: string, cwd: string | undefined, d: Deadline): Promise<Context>;
  contexts(sid: string, d: Deadline): Promise<Context[]>;
  restartContext(sid: string, cid: string, d: Deadline): Promise<void>;
  removeContext(sid: string, cid: string, d: Deadline): Promise<void>;
  /** Lets go of the sandboxes held (leased ones are then destroyed within seconds). */
  close(): Promise<void>;
}
