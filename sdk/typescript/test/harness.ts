// What the SDK's tests share: the real roched (started from bin/ on a socket of its own), the
// real roche CLI, and an image tag private to this test process, so that a leaked sandbox can
// be told from those of other tests on the same Docker engine. Needs `make build` and the test
// image (roche/python:local, or $ROCHE_TEST_IMAGE).

import { execFileSync, spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { accessSync, constants, copyFileSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import * as http from "node:http";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

// dist/test/harness.js -> the repository
export const REPO = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..", "..", "..");
export const SDK = join(REPO, "sdk", "typescript");
const BIN = process.env.ROCHE_BIN || join(REPO, "bin");
const BASE_IMAGE = process.env.ROCHE_TEST_IMAGE || "roche/python:local";
export const TRANSPORTS = ["daemon", "cli"] as const;

function run(argv: string[], check = true): string {
  try {
    return execFileSync(argv[0], argv.slice(1), { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"], timeout: 120_000 });
  } catch (e) {
    if (check) throw new Error(`${argv.join(" ")}: ${(e as { stderr?: string }).stderr ?? e}`);
    return (e as { stdout?: string }).stdout ?? "";
  }
}

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function answers(socket: string): Promise<boolean> {
  return new Promise((resolve) => {
    const req = http.get({ socketPath: socket, path: "/healthz", timeout: 1000 }, (res) => {
      res.resume();
      resolve(res.statusCode === 200);
    });
    req.on("error", () => resolve(false));
    req.on("timeout", () => req.destroy());
  });
}

/** A roched on a temporary socket. */
export class Daemon {
  readonly dir: string;
  readonly socket: string;
  readonly log: string;
  proc!: ChildProcess;

  /** dir: one a roched before this one used (its socket and state file), which this one then
   * serves, as a roched restarted there. */
  constructor(readonly name = "roched", private env: Record<string, string> = {}, private args: string[] = [], dir?: string) {
    this.dir = dir ?? mkdtempSync(join(tmpdir(), "roche-ts-test-"));
    this.socket = join(this.dir, `${name}.sock`);
    this.log = join(this.dir, `${name}.log`);
  }

  async start(): Promise<this> {
    const { openSync } = await import("node:fs");
    const log = openSync(this.log, "w");
    this.proc = spawn(env.roched, ["--socket", this.socket, "--log-level", "warn", ...this.args], {
      stdio: ["ignore", log, log],
      env: { ...process.env, ...this.env },
    });
    const until = Date.now() + 60_000;
    while (!(await answers(this.socket))) {
      if (this.proc.exitCode !== null || Date.now() > until) {
        const log = readFileSync(this.log, "utf8").slice(-2000);
        await this.stop();
        throw new Error(`roched did not start: ${log}`);
      }
      await sleep(50);
    }
    return this;
  }

  async stop(): Promise<void> {
    if (this.proc && this.proc.exitCode === null && this.proc.signalCode === null) {
      const gone = new Promise((r) => this.proc.once("exit", r));
      this.proc.kill("SIGTERM");
      const t = setTimeout(() => this.proc.kill("SIGKILL"), 60_000);
      await gone;
      clearTimeout(t);
    }
    rmSync(this.dir, { recursive: true, force: true });
  }
}

export const env = { image: "", cli: "", roched: "", daemon: undefined as Daemon | undefined, deadSocket: "", bin: "" };

/** Tags the private image, starts roched and points the SDK's environment at both. */
export async function setup(): Promise<void> {
  if (env.daemon) return;
  // A copy of bin/, so that a `make build` meanwhile cannot swap binaries mid-run.
  env.bin = mkdtempSync(join(tmpdir(), "roche-ts-test-bin-"));
  for (const name of ["roche", "roched", "roche-agent"]) {
    const path = join(BIN, name);
    try {
      accessSync(path, constants.X_OK);
    } catch {
      throw new Error(`${path} is missing: run \`make build\` first`);
    }
    copyFileSync(path, join(env.bin, name));
    execFileSync("chmod", ["755", join(env.bin, name)]);
  }
  env.cli = join(env.bin, "roche");
  env.roched = join(env.bin, "roched");
  const tag = `${BASE_IMAGE.slice(0, BASE_IMAGE.lastIndexOf(":"))}:ts-test-${randomBytes(4).toString("hex")}`;
  run(["docker", "tag", BASE_IMAGE, tag]);
  env.image = tag;
  // One owner for the CLI's direct-mode sandboxes and the roched processes of this run,
  // which serve those (roched --direct-owner's default): none another run makes.
  process.env.ROCHE_OWNER = `cli:ts-test-${randomBytes(4).toString("hex")}`;
  env.daemon = await new Daemon().start();
  env.deadSocket = join(env.daemon.dir, "nobody-listens.sock");
  process.env.ROCHE_SOCKET = env.daemon.socket;
  process.env.ROCHE_CLI = env.cli;
  process.env.ROCHE_IMAGE = tag;
}

/** The Roche containers, running or not, made from this process's private image tag. */
export function containers(): string[] {
  const out = run(["docker", "ps", "-a", "--filter", "label=roche.managed=true", "--format", "{{.ID}} {{.Image}}"]);
  return out.split("\n").filter(Boolean).map((l) => l.split(" ")).filter(([, img]) => img === env.image).map(([id]) => id);
}

export function running(id: string): boolean {
  return containers().some((c) => id.startsWith(c));
}

/** The command lines of the processes in a sandbox, from the host. */
export function processesIn(id: string): string[] {
  return run(["docker", "top", id, "-eo", "args"], false).split("\n").slice(1).filter(Boolean);
}

/** Stops roched, fails if any sandbox of ours is left (removing it), and untags the image. */
export async function teardown(): Promise<void> {
  let left = containers();
  const until = Date.now() + 20_000;
  while (left.length && Date.now() < until) {
    await sleep(250);
    left = containers();
  }
  if (left.length) run(["docker", "rm", "-f", ...left], false);
  await env.daemon?.stop();
  run(["docker", "rmi", env.image], false);
  rmSync(env.bin, { recursive: true, force: true });
  if (left.length) throw new Error(`${left.length} sandbox(es) left behind: ${left.join(", ")}`);
}
