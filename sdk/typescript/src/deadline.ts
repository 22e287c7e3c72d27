// A time limit for one call, so that the SDK never waits forever on a stuck daemon, engine or CLI.

import { SandboxTimeout } from "./errors.js";

export class Deadline {
  readonly at: number | undefined;
  constructor(readonly seconds: number | undefined) {
    this.at = seconds === undefined ? undefined : Date.now() + seconds * 1000;
  }

  /** Milliseconds left; undefined when there is no limit. */
  remainingMs(): number | undefined {
    return this.at === undefined ? undefined : this.at - Date.now();
  }

  expired(what: string): SandboxTimeout {
    return new SandboxTimeout(
      `timed out: ${what} did not answer within ${this.seconds} s; the call was abandoned ` +
        "(raise requestTimeout if the work is slow, or check that the sandbox is not paused)",
    );
  }

  /** An AbortSignal that fires at the deadline or when outer fires, and a dispose function
   * that clears its timer; `timedOut()` says whether the deadline fired it. */
  signal(outer?: AbortSignal): { signal: AbortSignal; timedOut: () => boolean; dispose: () => void } {
    const ctl = new AbortController();
    let fired = false;
    const left = this.remainingMs();
    const timer = left === undefined ? undefined : setTimeout(() => {
      fired = true;
      ctl.abort(new Error("deadline"));
    }, Math.max(0, left));
    const onOuter = () => ctl.abort(outer?.reason);
    if (outer?.aborted) ctl.abort(outer.reason);
    else outer?.addEventListener("abort", onOuter, { once: true });
    return {
      signal: ctl.signal,
      timedOut: () => fired,
      dispose: () => {
        if (timer !== undefined) clearTimeout(timer);
        outer?.removeEventListener("abort", onOuter);
      },
    };
  }
}
