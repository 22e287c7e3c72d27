// TLS to roched at an https:// address: the CA that verifies it (ca, else $ROCHE_CA_FILE,
// else Node's CAs), the client certificate it may require, and one line saying why a
// handshake failed.

import { readFileSync } from "node:fs";
import { InvalidConfig, ProviderUnavailable } from "./errors.js";

/** What node:tls and node:https take to verify roched and present a client certificate. */
export interface TLSFiles {
  ca?: Buffer;
  cert?: Buffer;
  key?: Buffer;
}

/** roched could not be reached safely: its certificate is not trusted or expired, or it
 * refused this client's. Never a reason to fall back to running elsewhere. */
export class TLSFailure extends ProviderUnavailable {}

function read(what: string, path: string): Buffer {
  try {
    return readFileSync(path);
  } catch (e) {
    throw new InvalidConfig(`${what} ${path}: ${(e as Error).message}`);
  }
}

/** The files named by the options, else $ROCHE_CA_FILE, $ROCHE_CLIENT_CERT and
 * $ROCHE_CLIENT_KEY, read once. */
export function tlsFiles(ca?: string, clientCert?: string, clientKey?: string): TLSFiles {
  ca = ca || process.env.ROCHE_CA_FILE || undefined;
  clientCert = clientCert || process.env.ROCHE_CLIENT_CERT || undefined;
  clientKey = clientKey || process.env.ROCHE_CLIENT_KEY || undefined;
  if (!clientCert !== !clientKey) {
    throw new InvalidConfig("a client certificate needs both clientCert and clientKey (or ROCHE_CLIENT_CERT and ROCHE_CLIENT_KEY)");
  }
  const out: TLSFiles = {};
  if (ca) {
    out.ca = read("CA file", ca);
    if (!out.ca.includes("-----BEGIN CERTIFICATE-----")) throw new InvalidConfig(`CA file ${ca} holds no PEM certificate`);
  }
  if (clientCert) {
    out.cert = read("client certificate", clientCert);
    out.key = read("client key", clientKey!);
  }
  return out;
}

const UNTRUSTED = new Set([
  "UNABLE_TO_VERIFY_LEAF_SIGNATURE",
  "UNABLE_TO_GET_ISSUER_CERT",
  "UNABLE_TO_GET_ISSUER_CERT_LOCALLY",
  "SELF_SIGNED_CERT_IN_CHAIN",
  "DEPTH_ZERO_SELF_SIGNED_CERT",
  "CERT_SIGNATURE_FAILURE",
  "CERT_UNTRUSTED",
]);

/** The one-line error for a TLS failure talking to roched at where, from the error's Node
 * code, or undefined when it is not about TLS. */
export function tlsProblem(where: string, code: string | undefined, message: string): TLSFailure | undefined {
  if (!code) return undefined;
  if (UNTRUSTED.has(code)) {
    return new TLSFailure(
      `roched at ${where} presented a certificate signed by an authority this client does not trust (${code}): ` +
        "give the CA that signed it with the ca option or ROCHE_CA_FILE",
    );
  }
  if (code === "CERT_HAS_EXPIRED") {
    return new TLSFailure(`roched at ${where} presented a certificate that expired: renew its --tls-cert (roched reloads it without a restart)`);
  }
  if (code === "CERT_NOT_YET_VALID") {
    return new TLSFailure(`roched at ${where} presented a certificate that is not valid yet (check this host's clock)`);
  }
  if (code === "ERR_TLS_CERT_ALTNAME_INVALID") {
    return new TLSFailure(`roched at ${where} presented a certificate for other names (${message}): use an address it names`);
  }
  if (code.startsWith("ERR_SSL_") && code.includes("ALERT") && (code.includes("CERTIFICATE") || code.includes("UNKNOWN_CA"))) {
    return new TLSFailure(
      `roched at ${where} refused this client's TLS handshake (${code}): it requires a client certificate signed by its ` +
        "--client-ca; give clientCert and clientKey (or ROCHE_CLIENT_CERT and ROCHE_CLIENT_KEY)",
    );
  }
  if (code === "ERR_SSL_WRONG_VERSION_NUMBER" || code === "ERR_SSL_PACKET_LENGTH_TOO_LONG" || code === "ERR_SSL_HTTP_REQUEST") {
    return new TLSFailure(`roched at ${where} does not speak TLS: use an http:// address, or give roched --tls-cert and --tls-key`);
  }
  if (where.startsWith("https://") && (code === "ECONNRESET" || code === "EPIPE")) {
    // TLS 1.3 ends the handshake before the server has checked the client's certificate,
    // so a refused one may show only as the connection closing.
    return new TLSFailure(
      `roched at ${where} closed the TLS connection: if it requires a client certificate (--client-ca), give clientCert ` +
        "and clientKey (or ROCHE_CLIENT_CERT and ROCHE_CLIENT_KEY) signed by that CA; else check that it is running",
    );
  }
  if (code.startsWith("ERR_SSL_") || code.startsWith("ERR_TLS_") || code === "EPROTO") {
    return new TLSFailure(`TLS with roched at ${where} failed: ${code}: ${message}`);
  }
  return undefined;
}
