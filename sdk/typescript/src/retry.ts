// Retries of calls to roched that are safe to repeat (the rules of the Go client's
// client/retry.go): a read, a destroy, a create (the SDK gives every create an idempotency
// key) and an exec given an idempotency key are repeated when the connection to roched was
// lost (roched restarting, or a replica of a group dying behind a Service that sends the
// next connection to another), with backoff and jitter, for at most RETRY_FOR_MS and never
// past the call's own deadline. An answer from roched, whatever it says, is never retried;
// nor is a call that found nothing listening on a roched this client has not reached before.

import type { Deadline } from "./deadline.js";
import { ProviderUnavailable } from "./errors.js";

/** The longest one call is retried for. */
export const RETRY_FOR_MS = 30_000;
export const FIRST_DELAY_MS = 100;
export const MAX_DELAY_MS = 2_000;

/** How an error lost its connection to roched (ProviderUnavailable's `lost`): "refused"
 * (nothing listened), "broke" (cut midway), or "" (an answer, a timeout, a TLS failure). */
export function lost(e: unknown): string {
  return e instanceof ProviderUnavailable ? e.lost : "";
}

/** The waits between the attempts of one call. */
export class Backoff {
  private until = Date.now() + RETRY_FOR_MS;
  private delay = FIRST_DELAY_MS;

  constructor(private d: Deadline) {}

  /** Milliseconds to wait before trying again after e, or undefined to give up (throw e). */
  next(e: unknown, reached: boolean): number | undefined {
    const kind = lost(e);
    if (kind !== "broke" && !(kind === "refused" && reached)) return undefined;
    // Jitter: many clients cut off by one replica's loss do not all come back at once.
    const wait = this.delay * (0.5 + Math.random() / 2);
    this.delay = Math.min(this.delay * 2, MAX_DELAY_MS);
    const left = this.d.remainingMs();
    if (Date.now() + wait > this.until || (left !== undefined && wait >= left)) return undefined;
    return wait;
  }
}
