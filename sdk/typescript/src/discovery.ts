// Where roched and the roche CLI are, by the CLI's own rules.

import { accessSync, constants, readFileSync, statSync } from "node:fs";
import { homedir, tmpdir } from "node:os";
import { delimiter, join } from "node:path";
import { InvalidConfig } from "./errors.js";
import { tlsFiles, type TLSFiles } from "./tls.js";

/** $ROCHE_SOCKET, else $XDG_RUNTIME_DIR/roche/roched.sock, else ~/.roche/roched.sock. */
export function defaultSocket(): string {
  if (process.env.ROCHE_SOCKET) return process.env.ROCHE_SOCKET;
  if (process.env.XDG_RUNTIME_DIR) return join(process.env.XDG_RUNTIME_DIR, "roche", "roched.sock");
  const home = homedir();
  if (home) return join(home, ".roche", "roched.sock");
  return join(tmpdir(), `roche-${process.getuid?.() ?? 0}`, "roched.sock");
}

/** The roche CLI: the one given, else $ROCHE_CLI, else roche on PATH. */
export function findCLI(explicit?: string): string | undefined {
  const path = explicit || process.env.ROCHE_CLI;
  if (path) return path;
  for (const dir of (process.env.PATH ?? "").split(delimiter)) {
    if (!dir) continue;
    const candidate = join(dir, "roche");
    try {
      accessSync(candidate, constants.X_OK);
      if (statSync(candidate).isFile()) return candidate;
    } catch {
      // not here
    }
  }
  return undefined;
}

/** How to reach roched: a unix socket, or an http(s) address with a token. */
export interface Endpoint {
  socket?: string;
  /** http://HOST:PORT or https://HOST:PORT when not a socket. */
  address?: string;
  token?: string;
  /** The W3C traceparent sent with every call (docs/traces.md): a value, or a function
   * asked before each call (e.g. one reading the active OpenTelemetry span). */
  traceparent?: string | (() => string | undefined);
  /** At an https:// address: the CA that verifies roched, and a client certificate. */
  tls?: TLSFiles;
}

/** The ca, clientCert and clientKey options (files). */
export interface TLSOptions {
  ca?: string;
  clientCert?: string;
  clientKey?: string;
}

export function where(ep: Endpoint): string {
  return ep.socket ?? ep.address ?? "";
}

/** The token in a file only its owner can read (as roched's --token-file): a token readable
 * by others is anyone's, so such a file is refused rather than used. */
export function readTokenFile(path: string): string {
  let mode: number;
  let token: string;
  try {
    mode = statSync(path).mode;
    token = readFileSync(path, "utf8").trim();
  } catch (e) {
    throw new InvalidConfig(`token file ${path}: ${(e as Error).message}`);
  }
  if (mode & 0o077) {
    throw new InvalidConfig(
      `token file ${path} is open to group or others (mode ${(mode & 0o777).toString(8).padStart(4, "0")}): chmod 600 ${path}`,
    );
  }
  if (!token) throw new InvalidConfig(`token file ${path} is empty`);
  return token;
}

const TRACEPARENT = /^[0-9a-f]{2}-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}$/;

/** tp if it is a W3C traceparent (version-traceid-spanid-flags, lowercase hex), else
 * InvalidConfig: nothing else goes into a header. */
export function checkTraceparent(tp: string | undefined): string | undefined {
  if (tp === undefined || tp === "") return undefined;
  if (typeof tp !== "string" || !TRACEPARENT.test(tp)) {
    throw new InvalidConfig(`traceparent ${JSON.stringify(tp)}: give a W3C traceparent, 00-<32 hex trace id>-<16 hex span id>-<2 hex flags>, e.g. from @opentelemetry/api's propagation.inject`);
  }
  return tp;
}

/** The endpoint for Roche's socket, address, token, tokenFile, ca, clientCert and clientKey
 * options: the token given, else the one in tokenFile (or $ROCHE_TOKEN_FILE), else
 * $ROCHE_TOKEN; at https://, the CA given, else $ROCHE_CA_FILE, else Node's CAs, and the
 * client certificate given, else $ROCHE_CLIENT_CERT and $ROCHE_CLIENT_KEY. */
export function endpoint(socket?: string, address?: string, token?: string, tokenFile?: string, t: TLSOptions = {}): Endpoint {
  tokenFile = tokenFile || process.env.ROCHE_TOKEN_FILE || undefined;
  if (!token && tokenFile) token = readTokenFile(tokenFile);
  token = token || process.env.ROCHE_TOKEN || undefined;
  if (!address) return { socket: socket || defaultSocket(), token };
  let u: URL;
  try {
    u = new URL(address);
  } catch {
    u = new URL("invalid:");
  }
  if ((u.protocol !== "http:" && u.protocol !== "https:") || !u.hostname) {
    throw new InvalidConfig(
      `daemon address ${JSON.stringify(address)}: use https://HOST:PORT (TLS) or http://HOST:PORT (plaintext, loopback), e.g. https://127.0.0.1:7878`,
    );
  }
  if (u.protocol === "http:") {
    if (t.ca || t.clientCert || t.clientKey) throw new InvalidConfig(`ca, clientCert and clientKey are for TLS: use https://${u.host}`);
    return { address: `http://${u.host}`, token };
  }
  return { address: `https://${u.host}`, token, tls: tlsFiles(t.ca, t.clientCert, t.clientKey) };
}
