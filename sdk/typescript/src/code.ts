// Code contexts: long-lived interpreters in a sandbox that keep their variables, and what a
// cell of code gives back, shaped like E2B's code interpreter (Execution, Result, Logs,
// ExecutionError, OutputMessage, Context) so that code written for it reads the same.
// Both transports build these from their own wire form: roched's messages or the CLI's
// `roche code --json-events` lines (Go's snake_case names).

import { InvalidConfig, RocheError } from "./errors.js";

/** Code languages a context can run, where the sandbox's image has the interpreter. */
export const LANGUAGES = ["python", "bash", "javascript"] as const;
/** How long runCode lets a cell run when given no timeout (roche.DefaultCodeTimeout), seconds. */
export const DEFAULT_CODE_TIMEOUT = 300;
const OUTPUT_LIMIT = 10 << 20;

/** A piece of a cell's output, as it was printed. */
export interface OutputMessage {
  line: string;
  /** When it arrived, milliseconds since the epoch. */
  timestamp: number;
  /** It came from stderr. */
  error: boolean;
}

/** The exception that ended a cell; a cell interrupted at its timeout ends in "KeyboardInterrupt". */
export interface ExecutionError {
  name: string;
  value: string;
  traceback: string;
}

/** What a cell printed, in the pieces it printed it in. */
export interface Logs {
  stdout: string[];
  stderr: string[];
}

const FORMATS = ["text", "html", "markdown", "svg", "png", "jpeg", "latex", "json", "javascript"] as const;

/** One rich result of a cell: a display call, a figure, or the value of the last expression
 * (isMainResult). Each form is set when the result has it; png and jpeg are base64 text. */
export class Result {
  text?: string;
  html?: string;
  markdown?: string;
  svg?: string;
  png?: string;
  jpeg?: string;
  latex?: string;
  /** application/json, parsed. */
  json?: unknown;
  javascript?: string;
  isMainResult = false;

  /** The forms this result has: "text", "html", "png", ... */
  formats(): string[] {
    return FORMATS.filter((f) => this[f] !== undefined);
  }
}

/** The outcome of a cell. An exception, a timeout or a dead interpreter are in error (and
 * timedOut, restarted), not thrown. */
export class Execution {
  results: Result[] = [];
  logs: Logs = { stdout: [], stderr: [] };
  error?: ExecutionError;
  /** The cells the context has run, this one included. */
  executionCount?: number;
  /** The id of the context that ran the cell. */
  context = "";
  /** The cell was interrupted at its timeout; the context keeps its variables. */
  timedOut = false;
  /** The context's interpreter had died (os._exit, the memory limit): a fresh one ran the cell. */
  restarted = false;
  /** A log stream passed the output limit and was cut. */
  truncated = false;
  /** Seconds the cell ran. */
  duration = 0;

  /** The value of the cell's last expression, as text. */
  get text(): string | undefined {
    return this.results.find((r) => r.isMainResult)?.text;
  }
}

/** A code context: a long-lived interpreter in the sandbox with variables of its own. */
export interface Context {
  id: string;
  language: string;
  cwd: string;
  /** The language's default context, which runCode uses when given none. */
  default: boolean;
}

/** runCode's options. */
export interface RunCodeOptions {
  /** "python" (the default), "bash" or "javascript": picks the default context when no context is given. */
  language?: string;
  /** The context to run in (from createCodeContext), or its id. */
  context?: Context | string;
  /** Interrupts the cell after this many milliseconds (300 s by default); the context keeps its variables. */
  timeoutMs?: number;
  onStdout?: (m: OutputMessage) => unknown;
  onStderr?: (m: OutputMessage) => unknown;
  onResult?: (r: Result) => unknown;
  onError?: (e: ExecutionError) => unknown;
  /** Aborts the call, which interrupts the cell. */
  signal?: AbortSignal;
}

/** A cell to run; built by Sandbox.runCode. */
export interface CodeRequest {
  code: string;
  language: string;
  context: string;
  /** Seconds; undefined for the default. */
  timeout?: number;
  signal?: AbortSignal;
}

export type CodeItem = OutputMessage | Result | Execution;

export function contextId(ctx: Context | string | undefined): string {
  if (ctx === undefined) return "";
  if (typeof ctx === "string" && ctx) return ctx;
  if (ctx && typeof ctx === "object" && typeof ctx.id === "string" && ctx.id) return ctx.id;
  throw new InvalidConfig(`context ${JSON.stringify(ctx)}: give a Context (from createCodeContext) or its id`);
}

export function checkLanguage(language: string | undefined): string {
  const lang = language ?? "";
  if (lang && !(LANGUAGES as readonly string[]).includes(lang)) {
    throw new InvalidConfig(`language ${JSON.stringify(language)}: choose one of ${LANGUAGES.join(", ")}`);
  }
  return lang;
}

/** Checks runCode's arguments, so that a mistake fails here with a hint. */
export function makeCodeRequest(code: string, o: RunCodeOptions): CodeRequest {
  if (typeof code !== "string") throw new InvalidConfig(`code ${JSON.stringify(code)}: give the source as a string`);
  const language = checkLanguage(o.language);
  if (o.timeoutMs !== undefined && !(o.timeoutMs > 0)) {
    throw new InvalidConfig(`timeoutMs ${o.timeoutMs}: give milliseconds > 0, or leave it out for ${DEFAULT_CODE_TIMEOUT} s`);
  }
  const ctx = o.context;
  if (ctx && typeof ctx === "object" && language && ctx.language && language !== ctx.language) {
    throw new InvalidConfig(`language ${JSON.stringify(language)} differs from the context's (${JSON.stringify(ctx.language)}): give one or the other`);
  }
  return { code, language, context: contextId(ctx), timeout: o.timeoutMs === undefined ? undefined : o.timeoutMs / 1000, signal: o.signal };
}

/** The fields of a result, by either name. */
export interface ResultFields {
  text?: string;
  html?: string;
  markdown?: string;
  svg?: string;
  png?: string;
  jpeg?: string;
  latex?: string;
  json?: string;
  javascript?: string;
  isMainResult?: boolean;
}

export function makeResult(f: ResultFields): Result {
  const r = new Result();
  for (const k of ["text", "html", "markdown", "svg", "png", "jpeg", "latex", "javascript"] as const) {
    if (f[k]) r[k] = f[k];
  }
  if (f.json) {
    try {
      r.json = JSON.parse(f.json);
    } catch {
      r.json = f.json;
    }
  }
  r.isMainResult = Boolean(f.isMainResult);
  return r;
}

/** A result as `roche code --json-events` prints it (Go's names, png as base64). */
export function resultFromCLI(m: Record<string, unknown>): Result {
  const s = (k: string) => (typeof m[k] === "string" ? (m[k] as string) : undefined);
  return makeResult({
    text: s("text"), html: s("html"), markdown: s("markdown"), svg: s("svg"), png: s("png"), jpeg: s("jpeg"),
    latex: s("latex"), json: s("json"), javascript: s("javascript"), isMainResult: Boolean(m.is_main_result),
  });
}

/** An execution as `roche code --json` prints it. */
export function executionFromCLI(m: Record<string, unknown>): Execution {
  const ex = new Execution();
  ex.results = ((m.results as Record<string, unknown>[] | undefined) ?? []).map(resultFromCLI);
  const logs = (m.logs ?? {}) as { stdout?: string[]; stderr?: string[] };
  ex.logs = { stdout: [...(logs.stdout ?? [])], stderr: [...(logs.stderr ?? [])] };
  const e = m.error as Record<string, unknown> | undefined;
  if (e) ex.error = { name: String(e.name ?? ""), value: String(e.value ?? ""), traceback: String(e.traceback ?? "") };
  ex.executionCount = Number(m.execution_count ?? 0);
  ex.context = String(m.context ?? "");
  ex.timedOut = Boolean(m.timed_out);
  ex.restarted = Boolean(m.restarted);
  ex.truncated = Boolean(m.truncated);
  ex.duration = Number(m.duration_ns ?? 0) / 1e9;
  return ex;
}

/** Turns a cell's output pieces into OutputMessages as they come, decoding characters split
 * across pieces whole, and keeps a capped copy of the logs and the results. */
export class CodeAssembler {
  private decoders = { stdout: new TextDecoder("utf-8"), stderr: new TextDecoder("utf-8") };
  private kept = { stdout: 0, stderr: 0 };
  logs: Logs = { stdout: [], stderr: [] };
  results: Result[] = [];
  truncated = false;

  output(stream: "stdout" | "stderr", data: Uint8Array): OutputMessage | undefined {
    const line = this.decoders[stream].decode(data, { stream: true });
    if (!line) return undefined;
    const room = OUTPUT_LIMIT - this.kept[stream];
    if (data.length > room) this.truncated = true;
    if (room > 0) {
      this.logs[stream].push(data.length <= room ? line : new TextDecoder().decode(data.subarray(0, room)));
      this.kept[stream] += Math.min(data.length, room);
    }
    return { line, timestamp: Date.now(), error: stream === "stderr" };
  }

  result(r: Result): Result {
    this.results.push(r);
    return r;
  }
}

/** Reads `roche code --json-events`: a JSON object a line, output and results while the cell
 * runs, the whole execution last. */
export class CodeEventParser {
  readonly asm = new CodeAssembler();
  private buf = Buffer.alloc(0);
  execution: Execution | undefined;

  *feed(data: Buffer): Generator<CodeItem> {
    this.buf = Buffer.concat([this.buf, data]);
    for (;;) {
      const nl = this.buf.indexOf(0x0a);
      if (nl < 0) return;
      const line = this.buf.subarray(0, nl).toString("utf8");
      this.buf = this.buf.subarray(nl + 1);
      if (!line.trim()) continue;
      let m: Record<string, unknown>;
      try {
        m = JSON.parse(line);
      } catch {
        throw new RocheError(`the roche CLI printed ${JSON.stringify(line.slice(0, 200))} where a code event was expected`);
      }
      if (typeof m.stream === "string") {
        const msg = this.asm.output(m.stream === "stderr" ? "stderr" : "stdout", Buffer.from(String(m.data ?? ""), "base64"));
        if (msg) yield msg;
      } else if (m.result && typeof m.result === "object") {
        yield this.asm.result(resultFromCLI(m.result as Record<string, unknown>));
      } else if (m.execution && typeof m.execution === "object") {
        this.execution = executionFromCLI(m.execution as Record<string, unknown>);
        yield this.execution;
      }
    }
  }
}

/** Which of runCode's callbacks each item of a cell's stream calls, so that a result reaches
 * onResult once, whether it came as produced or only in the execution. */
export async function dispatch(item: CodeItem, o: RunCodeOptions, seen: { results: number }): Promise<void> {
  if (item instanceof Execution) {
    for (const r of item.results.slice(seen.results)) await o.onResult?.(r);
    seen.results = item.results.length;
    if (item.error) await o.onError?.(item.error);
  } else if (item instanceof Result) {
    seen.results++;
    await o.onResult?.(item);
  } else {
    await (item.error ? o.onStderr : o.onStdout)?.(item);
  }
}
