// Roche's TypeScript SDK: run untrusted, LLM-written code in sandboxes with secure defaults.
//
//   import { Roche } from "roche-sandbox";
//   const roche = new Roche();
//   const sandbox = await roche.create({ image: "python:3.12-slim" });
//   try {
//     const result = await sandbox.exec(["python3", "-c", "print('hello')"]);
//     console.log(result.stdout);
//   } finally {
//     await sandbox.destroy();
//   }
//
// Calls go to roched (the daemon, with warm pools) when it answers, else to the roche CLI.

export { Roche, Sandbox, ExecStream, type RocheOptions } from "./roche.js";
export { Pty, PtyHandle, MAX_PTY_INPUT, type PtyCreateOptions } from "./pty.js";
export {
  Files,
  WatchHandle,
  FileType,
  FilesystemEventType,
  type EntryInfo,
  type WriteInfo,
  type WriteData,
  type FilesystemEvent,
  type FilesRequestOptions,
} from "./files.js";
export {
  Commands,
  CommandHandle,
  MAX_COMMAND_INPUT,
  type CommandConnectOptions,
  type CommandInfo,
  type CommandResult,
  type CommandRunOptions,
} from "./commands.js";
export {
  RocheError,
  SandboxNotFound,
  SandboxTimeout,
  ProviderUnavailable,
  InvalidConfig,
  Unsupported,
  ImageNotFound,
  ResourceExhausted,
  PermissionDenied,
  InUse,
  OutputGone,
} from "./errors.js";
export { TLSFailure } from "./tls.js";
export {
  Execution,
  Result,
  type Context,
  type ExecutionError,
  type Logs,
  type OutputMessage,
  type RunCodeOptions,
} from "./code.js";
export {
  DEFAULT_IMAGE,
  DEFAULT_COPY_MAX_BYTES,
  type CreateOptions,
  type EgressDecision,
  type ExecOptions,
  type EndReason,
  type ExecResult,
  type ListOptions,
  type Mount,
  type Receipt,
  type OutputEvent,
  type SandboxInfo,
  type Secret,
  type StoredSecret,
} from "./types.js";
