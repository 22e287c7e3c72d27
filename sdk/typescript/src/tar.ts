// The little of tar the files API needs through roched: a stream holding one file (CopyTo), and
// the first entry of a stream read as it arrives (CopyFrom), its size checked before any of it
// is kept.

import { InvalidConfig, PermissionDenied, ResourceExhausted, RocheError } from "./errors.js";

const BLOCK = 512;

function octal(n: number, width: number): string {
  return n.toString(8).padStart(width - 1, "0") + "\0";
}

function header(name: string, type: string, size: number, mode: number): Buffer {
  const h = Buffer.alloc(BLOCK);
  h.write(name, 0, 100, "utf8");
  h.write(octal(mode & 0o7777, 8), 100, "ascii");
  h.write(octal(0, 8), 108, "ascii");
  h.write(octal(0, 8), 116, "ascii");
  h.write(octal(size, 12), 124, "ascii");
  h.write(octal(Math.floor(Date.now() / 1000), 12), 136, "ascii");
  h.write("        ", 148, "ascii");
  h.write(type, 156, "ascii");
  h.write("ustar\x0000", 257, "ascii");
  let sum = 0;
  for (const b of h) sum += b;
  h.write(octal(sum, 7) + " ", 148, "ascii");
  return h;
}

function pad(n: number): Buffer {
  return Buffer.alloc((BLOCK - (n % BLOCK)) % BLOCK);
}

function paxRecord(key: string, value: string): string {
  const body = ` ${key}=${value}\n`;
  let n = Buffer.byteLength(body) + 1;
  while (String(n).length + Buffer.byteLength(body) !== n) n = String(n).length + Buffer.byteLength(body);
  return `${n}${body}`;
}

/** A tar stream holding one regular file (a PAX header first when its name is long). */
export function fileTar(name: string, data: Uint8Array, mode: number): Buffer {
  if (data.length >= 8 * 2 ** 30) {
    throw new ResourceExhausted(`resource exhausted: ${name} is ${data.length} bytes: writeFile takes less than 8 GiB`);
  }
  const parts: Buffer[] = [];
  if (Buffer.byteLength(name) > 100) {
    const pax = Buffer.from(paxRecord("path", name));
    parts.push(header("PaxHeader", "x", pax.length, 0o644), pax, pad(pax.length));
    name = Buffer.from(name).subarray(0, 100).toString("utf8");
  }
  parts.push(header(name, "0", data.length, mode), Buffer.from(data), pad(data.length), Buffer.alloc(2 * BLOCK));
  return Buffer.concat(parts);
}

function cstring(b: Buffer): string {
  const end = b.indexOf(0);
  return b.subarray(0, end < 0 ? b.length : end).toString("utf8");
}

function number(b: Buffer): number {
  if (b[0] & 0x80) {
    // base-256, for sizes past 8 GiB
    let n = b[0] & 0x7f;
    for (let i = 1; i < b.length; i++) n = n * 256 + b[i];
    return n;
  }
  const s = cstring(b).trim();
  return s ? parseInt(s, 8) : 0;
}

function paxRecords(b: Buffer): Record<string, string> {
  const out: Record<string, string> = {};
  let i = 0;
  while (i < b.length) {
    const sp = b.indexOf(0x20, i);
    if (sp < 0) break;
    const len = parseInt(b.subarray(i, sp).toString("ascii"), 10);
    if (!(len > 0)) break;
    const rec = b.subarray(sp + 1, i + len - 1).toString("utf8");
    const eq = rec.indexOf("=");
    if (eq > 0) out[rec.slice(0, eq)] = rec.slice(eq + 1);
    i += len;
  }
  return out;
}

/** Reads the first regular file of a tar stream given as chunks, refusing (as the Python SDK
 * does) a directory, a symlink, anything else, and a file over maxBytes before any of its
 * content is kept. Returns undefined for an archive with no entry. */
export async function firstFile(chunks: AsyncIterable<Uint8Array>, src: string, maxBytes: number): Promise<Buffer | undefined> {
  let buf = Buffer.alloc(0);
  const it = chunks[Symbol.asyncIterator]();
  let ended = false;
  const need = async (n: number): Promise<boolean> => {
    while (buf.length < n && !ended) {
      const r = await it.next();
      if (r.done) ended = true;
      else buf = buf.length ? Buffer.concat([buf, r.value]) : Buffer.from(r.value);
    }
    return buf.length >= n;
  };
  const take = (n: number): Buffer => {
    const out = buf.subarray(0, n);
    buf = buf.subarray(n);
    return out;
  };
  // An archive with no entry: read to its end, for the trailers that say what was left out.
  const none = async (): Promise<undefined> => {
    while (!ended) if ((await it.next()).done) ended = true;
    return undefined;
  };
  let pax: Record<string, string> = {};
  try {
    for (;;) {
      if (!(await need(BLOCK))) return none();
      const h = take(BLOCK);
      if (h.every((b) => b === 0)) return none();
      const type = String.fromCharCode(h[156] || 0x30);
      let size = number(h.subarray(124, 136));
      if (type === "x" || type === "g" || type === "L") {
        // PAX records (a size past 8 GiB); the name is not needed: it is the path asked for.
        const padded = size + ((BLOCK - (size % BLOCK)) % BLOCK);
        if (size > 1 << 20 || !(await need(padded))) throw new RocheError(`reading ${src}: the sandbox sent a malformed archive`);
        const body = take(padded).subarray(0, size);
        if (type === "x") pax = paxRecords(body);
        continue;
      }
      if (pax.size !== undefined) size = Number(pax.size);
      if (type === "5") {
        throw new InvalidConfig(`invalid config: ${src} is a directory: readFile reads files`);
      }
      if (type === "2") {
        throw new PermissionDenied(`permission denied: ${src} is a symlink, which the files API does not follow`);
      }
      if (type !== "0" && type !== "7") {
        throw new InvalidConfig(`invalid config: ${src} is not a regular file: readFile reads regular files`);
      }
      if (size > maxBytes) {
        throw new ResourceExhausted(
          `resource exhausted: ${src} is ${size} bytes, over the cap of ${maxBytes}: read less, or raise the cap with maxBytes`,
        );
      }
      if (!(await need(size))) throw new RocheError(`reading ${src}: the sandbox cut the file short`);
      return Buffer.from(take(size));
    }
  } finally {
    if (!ended) await it.return?.();
  }
}
