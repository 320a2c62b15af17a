// What the end-to-end tests share: packing the two tarballs as they would be published, running
// commands, and starting servers that are always stopped, by process group, even when a test fails.
import { spawn, type ChildProcess } from 'node:child_process';
import { cpSync, mkdtempSync, readdirSync, readFileSync, readlinkSync, realpathSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export { freePort } from '../__test__/support/redis.js';

export const root = join(__dirname, '..');
export const fixtures = join(__dirname, 'fixtures');

// Vitest's own variables (NODE_ENV=test among them) would change how next build and next start run.
const LEFT_OUT =
  /^(REDIS_URL|KV_URL|REDIS_TOKEN|UPSTASH_REDIS_REST_(URL|TOKEN)|KV_REST_API_(URL|TOKEN)|NODE_ENV|TEST|VITEST.*)$/;

/** The environment every command gets: the caller's, less Redis credentials and Vitest's variables. */
export function cleanEnv(extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  const env = Object.fromEntries(Object.entries(process.env).filter(([name]) => !LEFT_OUT.test(name)));
  return { ...env, NEXT_TELEMETRY_DISABLED: '1', ...extra };
}

export interface RunOptions {
  cwd: string;
  env?: NodeJS.ProcessEnv;
  /** For exec and run: SIGKILL to the command and what it started after this long (the code is then null). */
  timeoutMs?: number;
}

export interface Output {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** Runs a command to its end and answers its exit code and output, whatever the code. */
export function exec(
  command: string,
  args: string[],
  { cwd, env = cleanEnv(), timeoutMs }: RunOptions,
): Promise<Output> {
  return new Promise((resolve, reject) => {
    // In a process group of its own when it may be killed: what it started goes with it.
    const detached = timeoutMs !== undefined;
    const child = spawn(command, args, { cwd, env, detached, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    const timer =
      timeoutMs === undefined
        ? undefined
        : setTimeout(() => {
            stderr += `\n(killed after ${timeoutMs} ms)`;
            try {
              if (child.pid !== undefined) process.kill(-child.pid, 'SIGKILL');
            } catch {
              // The group has already ended.
            }
          }, timeoutMs);
    child.stdout.on('data', (chunk) => (stdout += chunk));
    child.stderr.on('data', (chunk) => (stderr += chunk));
    child.on('error', reject);
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

/** Runs a command that must succeed; a failure shows its output. */
export async function run(command: string, args: string[], options: RunOptions): Promise<string> {
  const output = await exec(command, args, options);
  if (output.code !== 0) {
    throw new Error(
      `${command} ${args.join(' ')} (in ${options.cwd}) exited with ${output.code}\n${output.stdout}\n${output.stderr}`,
    );
  }
  return output.stdout;
}

export function tempDir(name: string): string {
  return mkdtempSync(join(tmpdir(), `ratestore-${name}-`));
}

export function removeDir(dir: string): void {
  rmSync(dir, { recursive: true, force: true });
}

export interface Tarballs {
  /** The platform this machine's build is for, as in `npm/<triple>` and the binary's name. */
  triple: string;
  root: string;
  platform: string;
}

/**
 * `npm pack` of the root package and of its platform package, with the binary placed where
 * `napi artifacts` puts it (in a copy of npm/<triple>: binaries are never written into the tree).
 */
export async function packTarballs(dir: string): Promise<Tarballs> {
  const binary = readdirSync(root).find((name) => /^ratestore\..+\.node$/.test(name));
  if (!binary) throw new Error('no ratestore.<triple>.node in the checkout: `npm run test:e2e` builds it first');
  const triple = binary.slice('ratestore.'.length, -'.node'.length);
  const platformDir = join(dir, `npm-${triple}`);
  cpSync(join(root, 'npm', triple), platformDir, { recursive: true });
  cpSync(join(root, binary), join(platformDir, binary));
  const pack = async (cwd: string) => {
    const [packed] = JSON.parse(await run('npm', ['pack', '--json', '--pack-destination', dir], { cwd }));
    return join(dir, packed.filename as string);
  };
  return { triple, root: await pack(root), platform: await pack(platformDir) };
}

/** Installs tarballs (and whatever the directory's package.json asks for) with npm. */
export async function npmInstall(cwd: string, specs: string[], env?: NodeJS.ProcessEnv): Promise<void> {
  await run('npm', ['install', '--no-audit', '--no-fund', '--loglevel=error', ...specs], { cwd, env });
}

export const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** A process started in its own process group, so stopping it also stops whatever it started. */
export class Server {
  readonly #child: ChildProcess;
  readonly #exited: Promise<void>;
  #log = '';

  constructor(command: string, args: string[], { cwd, env = cleanEnv() }: RunOptions) {
    this.#child = spawn(command, args, { cwd, env, detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
    const append = (chunk: Buffer) => (this.#log += chunk);
    this.#child.stdout?.on('data', append);
    this.#child.stderr?.on('data', append);
    this.#exited = new Promise((resolve) => this.#child.on('close', () => resolve()));
    running.add(this);
  }

  /** What the process printed so far, for failure messages. */
  get log(): string {
    return this.#log;
  }

  /**
   * The binaries every process of the group runs, read from /proc (Linux): which runtime serves, whatever
   * the processes call themselves (`bun --bun` starts next's bin as a process named node).
   */
  executables(): Set<string> {
    const group = this.#child.pid;
    const found = new Set<string>();
    for (const pid of readdirSync('/proc').filter((name) => /^\d+$/.test(name))) {
      try {
        // pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses, so read after the last ')'.
        const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
        const pgrp = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[2]);
        if (pgrp === group) found.add(realpathSync(readlinkSync(`/proc/${pid}/exe`)));
      } catch {
        // The process ended while it was read.
      }
    }
    return found;
  }

  get exited(): boolean {
    return this.#child.exitCode !== null || this.#child.signalCode !== null;
  }

  /** Waits until the log matches, failing early when the process ends first. */
  async waitFor(pattern: RegExp, timeoutMs: number): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (!pattern.test(this.#log)) {
      if (this.exited) throw new Error(`the process ended before printing ${pattern}:\n${this.#log}`);
      if (Date.now() > deadline) throw new Error(`no ${pattern} after ${timeoutMs} ms:\n${this.#log}`);
      await sleep(50);
    }
  }

  signal(name: NodeJS.Signals): void {
    try {
      if (this.#child.pid !== undefined) process.kill(-this.#child.pid, name);
    } catch {
      // The group has already ended.
    }
  }

  /** SIGTERM to the group, SIGKILL when it has not ended within 5 s. */
  async stop(): Promise<void> {
    running.delete(this);
    if (!this.exited) this.signal('SIGTERM');
    const killer = setTimeout(() => this.signal('SIGKILL'), 5_000);
    await this.#exited;
    clearTimeout(killer);
    // Children that outlived the leader still belong to the group.
    this.signal('SIGKILL');
  }
}

const running = new Set<Server>();

/** Stops every server still running: call from afterAll. */
export async function stopAll(): Promise<void> {
  await Promise.all([...running].map((server) => server.stop()));
}

// A worker that dies without afterAll still takes its servers along.
process.on('exit', () => {
  for (const server of running) server.signal('SIGKILL');
});
