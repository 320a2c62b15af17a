// A throwaway redis-server on a free loopback port, for the tests that need one.
import { execFileSync } from 'node:child_process';
import { freePort, Server } from './support.js';

export interface RedisServer {
  url: string;
  stop(): Promise<void>;
}

function requireRedisServer(): void {
  try {
    execFileSync('redis-server', ['--version'], { stdio: 'ignore' });
  } catch {
    throw new Error(
      'redis-server is not installed: install it (Debian/Ubuntu: `apt-get install redis-server`, macOS: `brew install redis`) and run the tests again',
    );
  }
}

export async function startRedis(): Promise<RedisServer> {
  requireRedisServer();
  const port = await freePort();
  // No persistence: nothing is written to disk, and the data dies with the process.
  const server = new Server(
    'redis-server',
    ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--daemonize', 'no'],
    { cwd: process.cwd() },
  );
  await server.waitFor(/Ready to accept connections/, 10_000);
  return { url: `redis://127.0.0.1:${port}`, stop: () => server.stop() };
}
