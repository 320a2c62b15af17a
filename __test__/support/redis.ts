// Real redis-server processes for the redisStore suites: each suite starts
// its own on a free loopback port and stops it by pid. REDIS_URL, when set,
// replaces the server of the plain suites (never of the fault suites).
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { randomUUID } from 'node:crypto';
import { afterEach, expect } from 'vitest';
import { redisStore, type RedisStore } from '../../index.js';
import { freePort, retryPortTaken } from '../../scripts/free-port.js';

const INSTALL =
  'redis-server was not found on PATH. The redisStore tests run against a real Redis: install it with ' +
  '`apt-get install redis-server` (Debian/Ubuntu) or `brew install redis` (macOS).';

export interface RedisServer {
  readonly port: number;
  /** redis:// (or rediss:// with TLS) on 127.0.0.1, with the password if one is set. */
  readonly url: string;
  readonly pid: number;
  /** Runs redis-cli against this server and answers its output, trimmed. */
  cli(...args: string[]): Promise<string>;
  signal(signal: NodeJS.Signals): void;
  /** Starts the server again on the same port (after SIGKILL). */
  restart(): Promise<void>;
  stop(): Promise<void>;
}

export interface ServerOptions {
  password?: string;
  /** Serve TLS only, with these files (PEM). */
  tls?: { cert: string; key: string; ca: string };
}

const running = new Set<ChildProcess>();
process.on('exit', () => {
  for (const child of running) child.kill('SIGKILL');
});

export { freePort };

function launch(port: number, options: ServerOptions): Promise<ChildProcess> {
  const args = ['--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--protected-mode', 'no'];
  if (options.tls) {
    args.push('--port', '0', '--tls-port', String(port));
    args.push('--tls-cert-file', options.tls.cert, '--tls-key-file', options.tls.key);
    args.push('--tls-ca-cert-file', options.tls.ca, '--tls-auth-clients', 'no');
  } else {
    args.push('--port', String(port));
  }
  if (options.password) args.push('--requirepass', options.password);
  return new Promise((resolve, reject) => {
    const child = spawn('redis-server', args, { stdio: ['ignore', 'pipe', 'pipe'] });
    let output = '';
    const timer = setTimeout(() => fail(new Error(`redis-server did not start on port ${port}:\n${output}`)), 10_000);
    function fail(error: Error) {
      clearTimeout(timer);
      child.kill('SIGKILL');
      reject(error);
    }
    child.once('error', (error: NodeJS.ErrnoException) => fail(error.code === 'ENOENT' ? new Error(INSTALL) : error));
    child.once('exit', (code) => fail(new Error(`redis-server exited (${code}) on port ${port}:\n${output}`)));
    child.stdout!.on('data', (chunk: Buffer) => {
      output += chunk;
      if (output.includes('Ready to accept connections')) {
        clearTimeout(timer);
        child.removeAllListeners('exit');
        child.stdout!.removeAllListeners('data');
        child.stdout!.resume();
        running.add(child);
        child.once('exit', () => running.delete(child));
        resolve(child);
      }
    });
    child.stderr!.on('data', (chunk: Buffer) => (output += chunk));
  });
}

function exited(child: ChildProcess): Promise<void> {
  return child.exitCode !== null || child.signalCode !== null
    ? Promise.resolve()
    : new Promise((resolve) => child.once('exit', () => resolve()));
}

export async function startRedis(options: ServerOptions = {}): Promise<RedisServer> {
  // On a new port when another process took this one before the bind.
  const started = await retryPortTaken(async () => {
    const free = await freePort();
    return { free, child: await launch(free, options) };
  });
  const port = started.free;
  let child = started.child;
  const auth = options.password ? `:${encodeURIComponent(options.password)}@` : '';
  const url = `${options.tls ? 'rediss' : 'redis'}://${auth}127.0.0.1:${port}`;
  const tlsArgs = options.tls ? ['--tls', '--cacert', options.tls.ca] : [];
  // redis-cli 7.0 takes `:password@` for an empty user name; `default` is the user a password is for.
  const cliUrl = url.replace('://:', '://default:');
  return {
    port,
    url,
    get pid() {
      return child.pid!;
    },
    cli: (...args) => redisCli([...tlsArgs, '-u', cliUrl, ...args]),
    signal(signal) {
      child.kill(signal);
    },
    async restart() {
      await exited(child);
      child = await launch(port, options);
    },
    async stop() {
      child.kill('SIGCONT');
      child.kill('SIGKILL');
      await exited(child);
    },
  };
}

export function redisCli(args: string[]): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile('redis-cli', ['--no-auth-warning', ...args], { timeout: 10_000 }, (error, stdout, stderr) =>
      error ? reject(new Error(`redis-cli failed: ${stderr || error.message}`)) : resolve(stdout.trim()),
    );
  });
}

/**
 * The server for the plain suites: the one REDIS_URL names, or one of its own.
 * The external one is never stopped.
 */
export async function plainRedis(): Promise<Pick<RedisServer, 'url' | 'cli' | 'stop'>> {
  const external = process.env.REDIS_URL;
  if (!external) return startRedis();
  return { url: external, cli: (...args) => redisCli(['-u', external, ...args]), stop: async () => {} };
}

/** Every text an error carries: its message, its stack and each own property. */
/**
 * Scripts `server` has run so far: EVALSHA, and EVAL when a script is first sent (an EVALSHA that
 * answered NOSCRIPT ran nothing: it is a failed call).
 */
export async function scriptsRun(server: Pick<RedisServer, 'cli'>): Promise<number> {
  const stats = await server.cli('INFO', 'commandstats');
  let ran = 0;
  for (const [line] of stats.matchAll(/^cmdstat_(?:evalsha|eval):.*$/gm)) {
    ran += Number(/calls=(\d+)/.exec(line)![1]) - Number(/failed_calls=(\d+)/.exec(line)?.[1] ?? 0);
  }
  return ran;
}

export function errorText(error: unknown): string {
  if (!(error instanceof Error)) return String(error);
  const parts = [error.message, String(error.stack)];
  for (const name of Object.getOwnPropertyNames(error)) {
    parts.push(name, String((error as unknown as Record<string, unknown>)[name]));
  }
  return parts.join('\n');
}

/**
 * The error a call rejects with (failing the test if it resolves), checked to show none of `secrets`
 * (key markers, passwords, tokens) in its message, stack or own properties.
 */
export async function rejection(
  pending: Promise<unknown>,
  secrets: string[],
): Promise<Error & { code: string; sent?: boolean }> {
  const error = await pending.then(
    () => {
      throw new Error('the call resolved; it should have rejected');
    },
    (e: unknown) => e,
  );
  const text = errorText(error);
  for (const secret of secrets) expect(text).not.toContain(secret);
  return error as Error & { code: string; sent?: boolean };
}

/** Runs a fixture script with no Redis variables in its environment; answers its output once it exits by itself. */
export function runFixture(script: string, args: string[], nodeFlags: string[] = []): Promise<string> {
  const env = { ...process.env };
  for (const name of ['REDIS_URL', 'KV_URL', 'REDIS_TOKEN', 'REDIS_CLUSTER']) delete env[name];
  for (const name of ['UPSTASH_REDIS_REST_URL', 'UPSTASH_REDIS_REST_TOKEN', 'KV_REST_API_URL', 'KV_REST_API_TOKEN']) {
    delete env[name];
  }
  return new Promise((resolve, reject) => {
    execFile(process.execPath, [...nodeFlags, script, ...args], { env, timeout: 25_000 }, (error, stdout, stderr) =>
      error
        ? reject(new Error(`${script} ${args[0]} did not exit cleanly: ${error.message}\n${stderr}`))
        : resolve(stdout.trim()),
    );
  });
}

/**
 * A CA and a server certificate for 127.0.0.1 and localhost (for localhost only with `ip: false`), made by
 * openssl.
 */
export async function makeCertificates(
  dir: string,
  { ip = true }: { ip?: boolean } = {},
): Promise<{ ca: string; cert: string; key: string }> {
  const run = (...args: string[]) =>
    new Promise<void>((resolve, reject) =>
      execFile('openssl', args, { cwd: dir }, (error, _out, stderr) =>
        error ? reject(new Error(`openssl ${args[0]} failed: ${stderr}`)) : resolve(),
      ),
    );
  const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes'];
  await run(
    'req',
    '-x509',
    ...ec,
    '-keyout',
    'ca.key',
    '-out',
    'ca.crt',
    '-days',
    '2',
    '-subj',
    '/CN=ratestore test CA',
  );
  await run('req', ...ec, '-keyout', 'server.key', '-out', 'server.csr', '-subj', '/CN=localhost');
  writeFileSync(join(dir, 'san.cnf'), `subjectAltName=${ip ? 'IP:127.0.0.1,' : ''}DNS:localhost\n`);
  await run(
    'x509',
    '-req',
    '-in',
    'server.csr',
    '-CA',
    'ca.crt',
    '-CAkey',
    'ca.key',
    '-CAcreateserial',
    '-out',
    'server.crt',
    '-days',
    '2',
    '-extfile',
    'san.cnf',
  );
  return { ca: join(dir, 'ca.crt'), cert: join(dir, 'server.crt'), key: join(dir, 'server.key') };
}

/**
 * For a suite whose cases each start their own servers and stores: `server()` starts a redis-server and
 * `store(url, options)` makes a redisStore under a prefix of its own; both are stopped and closed after
 * each case, and `cleanups` takes anything else to undo. Call it at the top of the spec file.
 */
export function perCase(prefix: string): {
  server(options?: ServerOptions): Promise<RedisServer>;
  store(url: string, options?: Parameters<typeof redisStore>[0]): RedisStore;
  cleanups: (() => unknown)[];
} {
  const cleanups: (() => unknown)[] = [];
  afterEach(async () => {
    for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
  });
  return {
    cleanups,
    async server(options) {
      const started = await startRedis(options);
      cleanups.push(() => started.stop());
      return started;
    },
    store(url, options = {}) {
      const made = redisStore({ url, prefix: `${prefix}:${randomUUID()}:`, ...options });
      cleanups.push(() => made.close());
      return made;
    },
  };
}
