// `sandbox.files`: the files API, named as E2B's SDK names it. File content is streamed both
// ways (a file of any size moves in bounded memory); every call acts as the sandbox user,
// follows no symlink and refuses a path with "..", and nothing in /proc is served.

import { timestampDate } from "@bufbuild/protobuf/wkt";
import { InvalidConfig, RocheError, SandboxTimeout } from "./errors.js";
import { FileEventType as WireEventType, FileType as WireFileType, type FileEntry as WireEntry } from "./gen/roche/v1/sandbox_pb.js";
import type { Transport } from "./transport.js";

/** What a path is. */
export enum FileType {
  FILE = "file",
  DIR = "dir",
  SYMLINK = "symlink",
  /** A FIFO, socket or device node: the files API neither reads nor writes them. */
  OTHER = "other",
}

/** A path in the sandbox (E2B's EntryInfo). No symlink is followed: a symlink is described
 * itself, its target in `symlinkTarget`. */
export interface EntryInfo {
  name: string;
  type?: FileType;
  path: string;
  size: number;
  /** The permission bits (0o777 at most). */
  mode: number;
  /** Type and mode as `ls -l` shows them, as Go prints them: "-rw-r--r--", "drwxr-xr-x". */
  permissions: string;
  /** Names of uid and gid in the sandbox's /etc/passwd and /etc/group ("" if none). */
  owner: string;
  group: string;
  modifiedTime?: Date;
  symlinkTarget?: string;
  uid: number;
  gid: number;
}

/** What files.write returns: the file written. */
export type WriteInfo = EntryInfo;

/** What happened to a path below a watched directory. */
export enum FilesystemEventType {
  CHMOD = "chmod",
  CREATE = "create",
  REMOVE = "remove",
  /** The old name of a rename (its new one, inside the watched tree, comes as CREATE). */
  RENAME = "rename",
  WRITE = "write",
  /** Events were dropped because the reader fell behind; `lost` counts them (0: unknown). */
  OVERFLOW = "overflow",
}

/** One change below a watched directory. */
export interface FilesystemEvent {
  /** The path relative to the watched directory ("" for the directory itself, in the last
   * event of a watch whose directory was removed or renamed). */
  name: string;
  type: FilesystemEventType;
  lost?: number;
}

/** Content files.write takes: sent as it is read. */
export type WriteData = string | Uint8Array | ArrayBuffer | Blob | ReadableStream<Uint8Array> | AsyncIterable<Uint8Array> | Iterable<Uint8Array>;

export interface FilesRequestOptions {
  /** Milliseconds a call may go without progress (a stream) or take (the others);
   * default: the Roche's requestTimeout. */
  requestTimeoutMs?: number;
}

/** Events a watch handle keeps for a reader that does not take them. */
export const WATCH_QUEUE = 10_000;
/** The most content one WriteFile message carries. */
export const FILE_CHUNK = 256 << 10;
const MAX_LIST_DEPTH = 64;

export function checkPath(path: string, what = "path"): string {
  if (typeof path !== "string" || !path.startsWith("/")) {
    throw new InvalidConfig(`invalid config: ${what} ${JSON.stringify(path)} is not absolute: give a path starting with /, e.g. /tmp/data.txt`);
  }
  if (path.split("/").includes("..")) {
    throw new InvalidConfig(`invalid config: ${what} ${JSON.stringify(path)} climbs with "..": give the path it means without it`);
  }
  if (path.includes("\0")) throw new InvalidConfig(`invalid config: ${what} holds a NUL byte`);
  return path;
}

const WIRE_TYPES: Record<number, FileType> = {
  [WireFileType.FILE]: FileType.FILE,
  [WireFileType.DIRECTORY]: FileType.DIR,
  [WireFileType.SYMLINK]: FileType.SYMLINK,
  [WireFileType.OTHER]: FileType.OTHER,
};

/** The entry of roched's FileEntry. */
export function entryFromWire(e: WireEntry | undefined): EntryInfo {
  const path = e?.path ?? "";
  return {
    name: e?.name || path.split("/").pop() || "",
    type: WIRE_TYPES[e?.type ?? 0],
    path,
    size: Number(e?.size ?? 0),
    mode: e?.mode ?? 0,
    permissions: e?.permissions ?? "",
    owner: e?.owner ?? "",
    group: e?.group ?? "",
    modifiedTime: e?.modifiedTime ? timestampDate(e.modifiedTime) : undefined,
    symlinkTarget: e?.symlinkTarget || undefined,
    uid: e?.uid ?? 0,
    gid: e?.gid ?? 0,
  };
}

const WIRE_EVENTS: Record<number, FilesystemEventType> = {
  [WireEventType.CREATE]: FilesystemEventType.CREATE,
  [WireEventType.WRITE]: FilesystemEventType.WRITE,
  [WireEventType.REMOVE]: FilesystemEventType.REMOVE,
  [WireEventType.RENAME]: FilesystemEventType.RENAME,
  [WireEventType.CHMOD]: FilesystemEventType.CHMOD,
  [WireEventType.OVERFLOW]: FilesystemEventType.OVERFLOW,
};

export function eventFromWire(e: { name: string; type: number; lost: bigint }): FilesystemEvent | undefined {
  const type = WIRE_EVENTS[e.type];
  return type === undefined ? undefined : { name: e.name, type, lost: Number(e.lost) };
}

/** An entry as `roche files ... --json` prints it. */
export function entryFromCLI(o: unknown): EntryInfo {
  if (!o || typeof o !== "object") throw new RocheError(`the roche CLI printed ${JSON.stringify(o)} where an entry was expected`);
  const m = o as Record<string, unknown>;
  const t = String(m.type ?? "");
  return {
    name: String(m.name ?? ""),
    type: t === "file" ? FileType.FILE : t === "dir" ? FileType.DIR : t === "symlink" ? FileType.SYMLINK : t ? FileType.OTHER : undefined,
    path: String(m.path ?? ""),
    size: Number(m.size ?? 0),
    mode: parseInt(String(m.mode ?? "0"), 8),
    permissions: String(m.permissions ?? ""),
    owner: String(m.owner ?? ""),
    group: String(m.group ?? ""),
    modifiedTime: typeof m.modified_time === "string" ? new Date(m.modified_time) : undefined,
    symlinkTarget: typeof m.symlink_target === "string" && m.symlink_target ? m.symlink_target : undefined,
    uid: Number(m.uid ?? 0),
    gid: Number(m.gid ?? 0),
  };
}

/** A line of `roche files watch --json`: "started", an event, or undefined. */
export function eventFromCLI(line: string): FilesystemEvent | "started" | undefined {
  let m: Record<string, unknown>;
  try {
    m = JSON.parse(line);
  } catch {
    throw new RocheError(`roche files watch printed what is not JSON: ${line.slice(0, 200)}`);
  }
  if (m.type === "started") return "started";
  const type = Object.values(FilesystemEventType).find((t) => t === m.type);
  return type === undefined ? undefined : { name: String(m.name ?? ""), type, lost: Number(m.lost ?? 0) };
}

/** A time limit on each wait of a long call: it fires only when nothing moved for ms. */
export class IdleTimer {
  private ctl = new AbortController();
  private timer: NodeJS.Timeout | undefined;
  private fired = false;
  constructor(private readonly ms: number, private readonly what: string, outer?: AbortSignal) {
    this.touch();
    if (outer?.aborted) this.ctl.abort(outer.reason);
    else outer?.addEventListener("abort", () => this.ctl.abort(outer.reason), { once: true });
  }

  get signal(): AbortSignal {
    return this.ctl.signal;
  }

  /** Progress: the clock starts again. */
  touch(): void {
    clearTimeout(this.timer);
    this.timer = setTimeout(() => {
      this.fired = true;
      this.ctl.abort(this.error());
    }, this.ms);
  }

  abort(reason?: unknown): void {
    this.ctl.abort(reason);
  }

  /** The timeout error, when it fired. */
  timedOut(): SandboxTimeout | undefined {
    return this.fired ? this.error() : undefined;
  }

  private error(): SandboxTimeout {
    return new SandboxTimeout(
      `timed out: ${this.what} moved nothing for ${this.ms / 1000} s; the call was abandoned ` +
        "(raise requestTimeoutMs if the sandbox is that slow, or check that it is not paused)",
    );
  }

  dispose(): void {
    clearTimeout(this.timer);
  }
}

/** The pieces of what files.write takes, as it is read. */
export async function* piecesOf(data: WriteData): AsyncGenerator<Uint8Array> {
  if (typeof data === "string") {
    yield new TextEncoder().encode(data);
  } else if (data instanceof Uint8Array) {
    yield data;
  } else if (data instanceof ArrayBuffer) {
    yield new Uint8Array(data);
  } else if (typeof Blob !== "undefined" && data instanceof Blob) {
    yield* readStream(data.stream() as ReadableStream<Uint8Array>);
  } else if (typeof ReadableStream !== "undefined" && data instanceof ReadableStream) {
    yield* readStream(data);
  } else if (data && typeof (data as AsyncIterable<Uint8Array>)[Symbol.asyncIterator] === "function") {
    for await (const piece of data as AsyncIterable<Uint8Array>) yield checkPiece(piece);
  } else if (data && typeof (data as Iterable<Uint8Array>)[Symbol.iterator] === "function") {
    for (const piece of data as Iterable<Uint8Array>) yield checkPiece(piece);
  } else {
    throw new InvalidConfig("invalid config: write() takes a string, bytes, a Blob, a ReadableStream or an (async) iterable of Uint8Array");
  }
}

function checkPiece(piece: unknown): Uint8Array {
  if (typeof piece === "string") return new TextEncoder().encode(piece);
  if (!(piece instanceof Uint8Array)) throw new InvalidConfig("invalid config: write() got a piece that is not a Uint8Array");
  return piece;
}

async function* readStream(s: ReadableStream<Uint8Array>): AsyncGenerator<Uint8Array> {
  const r = s.getReader();
  try {
    for (;;) {
      const { done, value } = await r.read();
      if (done) return;
      yield value;
    }
  } finally {
    r.releaseLock();
  }
}

/** A watch of a directory (files.watchDir). Its events go to `onEvent` when one was given;
 * otherwise they are kept, at most WATCH_QUEUE (an overflow event counts what did not fit),
 * for getNewEvents() or for iterating the handle (`for await (const e of handle)`). stop()
 * ends it; so does the removal of the directory, whose own event (name "") is the last. */
export class WatchHandle implements AsyncIterable<FilesystemEvent> {
  private kept: FilesystemEvent[] = [];
  private lost = 0;
  private wake: (() => void) | undefined;
  private ended = false;
  private stopped = false;
  /** The error that ended the watch; undefined while it runs, after stop(), or when its
   * directory went. */
  error: Error | undefined;
  private readonly done: Promise<void>;

  constructor(
    events: AsyncIterator<FilesystemEvent | undefined>,
    private readonly ctl: AbortController,
    onEvent?: (e: FilesystemEvent) => void | Promise<void>,
    onExit?: (err?: Error) => void | Promise<void>,
  ) {
    this.done = (async () => {
      try {
        for (;;) {
          const { done, value } = await events.next();
          if (done) break;
          if (!value) continue;
          if (onEvent) await onEvent(value);
          else this.keep(value);
        }
      } catch (e) {
        if (!this.stopped) this.error = e instanceof Error ? e : new RocheError(String(e));
      } finally {
        this.ended = true;
        this.wake?.();
        await onExit?.(this.error);
      }
    })();
    void this.done;
  }

  private keep(e: FilesystemEvent): void {
    if (this.kept.length >= WATCH_QUEUE) {
      this.lost += 1 + (e.type === FilesystemEventType.OVERFLOW ? (e.lost ?? 0) : 0);
    } else {
      if (this.lost) {
        this.kept.push({ name: "", type: FilesystemEventType.OVERFLOW, lost: this.lost });
        this.lost = 0;
      }
      this.kept.push(e);
    }
    this.wake?.();
  }

  /** The events since the last call (without waiting); losses as an overflow event. After
   * the watch ended with an error, that error is thrown once what was kept was taken. */
  getNewEvents(): FilesystemEvent[] {
    const out = this.kept;
    this.kept = [];
    if (this.lost) {
      out.push({ name: "", type: FilesystemEventType.OVERFLOW, lost: this.lost });
      this.lost = 0;
    }
    if (out.length === 0 && this.ended && this.error) throw this.error;
    return out;
  }

  /** The watch still runs. */
  get running(): boolean {
    return !this.ended;
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<FilesystemEvent> {
    for (;;) {
      const got = this.getNewEventsOrNothing();
      if (got.length) {
        yield* got;
        continue;
      }
      if (this.ended) {
        if (this.error) throw this.error;
        return;
      }
      await new Promise<void>((r) => (this.wake = r));
      this.wake = undefined;
    }
  }

  private getNewEventsOrNothing(): FilesystemEvent[] {
    const out = this.kept;
    this.kept = [];
    if (this.lost) {
      out.push({ name: "", type: FilesystemEventType.OVERFLOW, lost: this.lost });
      this.lost = 0;
    }
    return out;
  }

  /** Ends the watch. */
  async stop(): Promise<void> {
    this.stopped = true;
    this.ctl.abort(new RocheError("the watch was stopped"));
    await this.done;
  }
}

/** `sandbox.files`: read, write, list, stat and watch the sandbox's files, as its user. */
export class Files {
  constructor(private readonly t: Transport, private readonly sid: string, private readonly timeoutS: number) {}

  private ms(o?: FilesRequestOptions): number {
    return o?.requestTimeoutMs ?? this.timeoutS * 1000;
  }

  /** A file's content: format "text" (the default), "bytes" (Uint8Array), "blob" or "stream"
   * (a ReadableStream of the pieces as they arrive; cancelling it ends the read). What is
   * sent is the file as it was when the read began. A file over maxBytes (default roched's
   * cap, 1 GiB) throws ResourceExhausted before any of it is sent; a directory, FIFO or
   * device InvalidConfig; a symlink PermissionDenied. */
  async read(path: string, opts?: FilesRequestOptions & { format?: "text"; maxBytes?: number }): Promise<string>;
  async read(path: string, opts: FilesRequestOptions & { format: "bytes"; maxBytes?: number }): Promise<Uint8Array>;
  async read(path: string, opts: FilesRequestOptions & { format: "blob"; maxBytes?: number }): Promise<Blob>;
  async read(path: string, opts: FilesRequestOptions & { format: "stream"; maxBytes?: number }): Promise<ReadableStream<Uint8Array>>;
  async read(path: string, opts: FilesRequestOptions & { format?: "text" | "bytes" | "blob" | "stream"; maxBytes?: number } = {}): Promise<unknown> {
    checkPath(path);
    const format = opts.format ?? "text";
    if (!["text", "bytes", "blob", "stream"].includes(format)) {
      throw new InvalidConfig(`invalid config: format ${JSON.stringify(format)}: give "text", "bytes", "blob" or "stream"`);
    }
    const pieces = this.pieces(path, opts.maxBytes ?? 0, this.ms(opts));
    if (format === "stream") {
      return new ReadableStream<Uint8Array>({
        async pull(ctl) {
          const { done, value } = await pieces.next();
          if (done) ctl.close();
          else ctl.enqueue(value);
        },
        async cancel() {
          await pieces.return(undefined);
        },
      });
    }
    const all: Uint8Array[] = [];
    for await (const p of pieces) all.push(p);
    const bytes = Buffer.concat(all);
    if (format === "text") return bytes.toString("utf8");
    if (format === "blob") return new Blob([bytes]);
    return new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.length);
  }

  private async *pieces(path: string, maxBytes: number, ms: number): AsyncGenerator<Uint8Array> {
    for await (const item of this.t.fileRead(this.sid, path, maxBytes, ms)) {
      if (item instanceof Uint8Array) yield item;
    }
  }

  /** Writes data to the file at path, replacing it and making its missing parents, and returns
   * what was written. data is a string (UTF-8), bytes, a Blob, a ReadableStream or an (async)
   * iterable of Uint8Array, sent as it is read: nothing is held whole. More than maxBytes
   * (default roched's cap, 1 GiB) or past the sandbox's disk space throws ResourceExhausted
   * and leaves no file. */
  async write(path: string, data: WriteData, opts: FilesRequestOptions & { mode?: number; maxBytes?: number } = {}): Promise<WriteInfo> {
    checkPath(path);
    const mode = opts.mode ?? 0o644;
    if (!Number.isInteger(mode) || mode < 0 || mode > 0o777) throw new InvalidConfig(`invalid config: mode ${mode}: give permission bits, at most 0o777`);
    return this.t.fileWrite(this.sid, path, piecesOf(data), mode, opts.maxBytes ?? 0, this.ms(opts));
  }

  /** What is below the directory path, to `depth` levels (1: its entries; at most 64), each
   * directory's entries in name order before what is below them. A symlink is listed, not
   * entered; more than 100,000 entries throws ResourceExhausted. */
  async list(path: string, opts: FilesRequestOptions & { depth?: number } = {}): Promise<EntryInfo[]> {
    checkPath(path);
    const depth = opts.depth ?? 1;
    if (!Number.isInteger(depth) || depth < 1 || depth > MAX_LIST_DEPTH) {
      throw new InvalidConfig(`invalid config: depth ${depth}: give 1 (the directory's entries) to ${MAX_LIST_DEPTH}`);
    }
    return this.t.fileList(this.sid, path, depth, this.ms(opts));
  }

  /** Describes path (a symlink itself); SandboxNotFound when it does not exist. */
  async getInfo(path: string, opts: FilesRequestOptions = {}): Promise<EntryInfo> {
    checkPath(path);
    return (await this.t.fileStat(this.sid, path, false, this.ms(opts)))!;
  }

  /** Roche's name for getInfo. */
  stat(path: string, opts: FilesRequestOptions = {}): Promise<EntryInfo> {
    return this.getInfo(path, opts);
  }

  /** Whether path exists (a symlink counts). A sandbox that is gone throws, never false. */
  async exists(path: string, opts: FilesRequestOptions = {}): Promise<boolean> {
    checkPath(path);
    return (await this.t.fileStat(this.sid, path, true, this.ms(opts))) !== undefined;
  }

  /** Makes the directory path and its missing parents; true when it made it, false when it
   * was a directory already. */
  async makeDir(path: string, opts: FilesRequestOptions = {}): Promise<boolean> {
    checkPath(path);
    return this.t.fileMkdir(this.sid, path, this.ms(opts));
  }

  /** Moves oldPath to newPath (a symlink is moved itself) and describes it there. */
  async rename(oldPath: string, newPath: string, opts: FilesRequestOptions = {}): Promise<EntryInfo> {
    checkPath(oldPath, "oldPath");
    checkPath(newPath, "newPath");
    return this.t.fileRename(this.sid, oldPath, newPath, this.ms(opts));
  }

  /** Removes path and, for a directory, everything below it (a symlink itself). */
  async remove(path: string, opts: FilesRequestOptions = {}): Promise<void> {
    checkPath(path);
    await this.t.fileRemove(this.sid, path, this.ms(opts));
  }

  /** Watches the directory path (with `recursive`, every directory below it too, later ones
   * included) and resolves once the watch is in place: every change after it is reported
   * (create, write, remove, rename, chmod; overflow when events were dropped, with how many).
   * Without onEvent the handle keeps them (getNewEvents(), or iterate it). */
  async watchDir(path: string, onEvent?: (e: FilesystemEvent) => void | Promise<void>,
    opts: FilesRequestOptions & { recursive?: boolean; onExit?: (err?: Error) => void | Promise<void> } = {}): Promise<WatchHandle> {
    checkPath(path);
    const ctl = new AbortController();
    const events = this.t.fileWatch(this.sid, path, opts.recursive ?? false, this.ms(opts), ctl.signal);
    let first: IteratorResult<FilesystemEvent | undefined>;
    try {
      first = await events.next();
    } catch (e) {
      ctl.abort();
      throw e;
    }
    if (first.done || first.value !== undefined) {
      ctl.abort();
      throw new RocheError(`the watch of ${path} ${first.done ? "ended" : "sent an event"} before it started`);
    }
    return new WatchHandle(events, ctl, onEvent, opts.onExit);
  }
}
