// Typed errors, as the Python SDK's: each carries Roche's own message, which says what to do,
// and `reason`, the core error behind it ("not_found", "invalid_config", ...).

/** Base of every error the SDK throws. `reason` is "" when Roche did not say. `retryAfter`,
 * in seconds, is set on a refusal that passes (roched's pool with a full queue throws
 * ResourceExhausted with it): how long to wait before asking again. */
export class RocheError extends Error {
  readonly reason: string;
  retryAfter?: number;
  constructor(message: string, reason = "") {
    super(message);
    this.name = new.target.name;
    this.reason = reason;
  }
}

/** No sandbox has that id: it was destroyed, its lifetime ended, or it never existed. */
export class SandboxNotFound extends RocheError {
  constructor(message: string) { super(message, "not_found"); }
}

/** Roche did not answer in time (the daemon, the engine or the sandbox is stuck). A command
 * that runs past its own `timeout` is not an error: its result says `timedOut`. */
export class SandboxTimeout extends RocheError {
  constructor(message: string) { super(message, "timeout"); }
}

/** The backend cannot be reached: no daemon and no CLI, Docker down, python.wasm missing. */
export class ProviderUnavailable extends RocheError {
  /** Set when the call's connection to roched was lost rather than answered: "refused"
   * (nothing listened) or "broke" (cut midway); what the SDK's retries go by. */
  lost: "" | "refused" | "broke" = "";
  constructor(message: string, lost: "" | "refused" | "broke" = "") {
    super(message, "unavailable");
    this.lost = lost;
  }
}

/** The request is malformed or impossible (a bad memory size, an empty command, ...). */
export class InvalidConfig extends RocheError {
  constructor(message: string, reason = "invalid_config") { super(message, reason); }
}

/** The provider cannot honour the request without weakening the sandbox. */
export class Unsupported extends InvalidConfig {
  constructor(message: string) { super(message, "unsupported"); }
}

/** The image is not present locally and could not be pulled. */
export class ImageNotFound extends InvalidConfig {
  constructor(message: string) { super(message, "image_not_found"); }
}

/** A limit was reached, e.g. the daemon's --max-sandboxes, or a file over maxBytes. */
export class ResourceExhausted extends RocheError {
  constructor(message: string) { super(message, "exhausted"); }
}

/** The sandbox does not allow it (a read-only path, another user's file). */
export class PermissionDenied extends RocheError {
  constructor(message: string) { super(message, "permission_denied"); }
}

/** Something still uses it: a workspace mounted by a live sandbox, or a snapshot a live
 * sandbox was made from. Destroy those sandboxes first. */
export class InUse extends RocheError {
  constructor(message: string) { super(message, "in_use"); }
}

/** A command's output asked for fell out of its window: a command keeps the last bytes of
 * each stream (16 MiB by default), and the oldest go. The message names the first offset
 * still kept of each stream; `commands.list()` shows them too (`firstStdout`,
 * `firstStderr`). Connect again from there. */
export class OutputGone extends RocheError {
  constructor(message: string) { super(message, "output_gone"); }
}

const BY_REASON: Record<string, new (message: string) => RocheError> = {
  not_found: SandboxNotFound,
  timeout: SandboxTimeout,
  unavailable: ProviderUnavailable,
  invalid_config: InvalidConfig,
  unsupported: Unsupported,
  image_not_found: ImageNotFound,
  exhausted: ResourceExhausted,
  permission_denied: PermissionDenied,
  in_use: InUse,
  output_gone: OutputGone,
};

/** The typed error for a core error reason, with the wait a refusal suggests, if any. */
export function errorFor(reason: string, message: string, retryAfter?: number): RocheError {
  const cls = BY_REASON[reason];
  const e = cls ? new cls(message) : new RocheError(message, reason);
  if (retryAfter !== undefined && retryAfter > 0) e.retryAfter = retryAfter;
  return e;
}

// The core's sentinel texts (errors.go), which every message wrapping them contains.
// Longer phrases first: "image not found" also contains "not found".
const BY_TEXT: ReadonlyArray<[string, string]> = [
  ["image not found", "image_not_found"],
  ["invalid config", "invalid_config"],
  ["unsupported", "unsupported"],
  ["provider unavailable", "unavailable"],
  ["resource exhausted", "exhausted"],
  ["permission denied", "permission_denied"],
  ["in use", "in_use"],
  ["output no longer kept", "output_gone"],
  ["not found", "not_found"],
  ["timed out", "timeout"],
];

/** The core error a message names: its leading sentinel, else any sentinel in it. Used only
 * for a CLI that does not yet report its errors as JSON. */
export function reasonFromText(message: string): string {
  const lower = message.toLowerCase();
  for (const [text, reason] of BY_TEXT) {
    if (lower.startsWith(text + ":")) return reason;
  }
  for (const [text, reason] of BY_TEXT) {
    if (lower.includes(text + ":") || lower.endsWith(text)) return reason;
  }
  return "";
}
