'use strict';
// The runtime suite (`npm run test:runtimes`): starts its own redis-servers (one over TCP, TLS and a
// Unix socket, a cluster, a REST endpoint, a sentinel), a PostgreSQL, a MariaDB and a SQLite file, and runs checks.js under each
// runtime the runtimes package installs, checking each one's exit code and signal: an abort or a
// segfault fails it. `node __test__/runtimes/run.js node22 bun` runs only those. scripts/test-linux.js
// runs the same checks with the arm64 and musl binaries (startTargets and runChecks below).

const { spawn, spawnSync, execFileSync } = require('node:child_process');
const { mkdtempSync, rmSync, writeFileSync } = require('node:fs');
const { tmpdir } = require('node:os');
const { join } = require('node:path');
const { freePort } = require('../../scripts/free-port.js');
const { startCluster } = require('../../scripts/redis-cluster.js');
const { startPostgres } = require('../../scripts/postgres-server.js');
const { startMariadb } = require('../../scripts/mariadb-server.js');
const { startRest } = require('../../scripts/rest-endpoint.js');
const { runtimes } = require('../../scripts/runtimes.js');

const children = [];

async function redisServer(args) {
  const child = spawn('redis-server', ['--save', '', '--appendonly', 'no', ...args], { stdio: 'ignore' });
  children.push(child);
  return child;
}

async function waitFor(cli) {
  for (let i = 0; i < 100; i++) {
    if (spawnSync('redis-cli', [...cli, 'PING'], { encoding: 'utf8' }).stdout.trim() === 'PONG') return;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  throw new Error(`redis-server did not answer: redis-cli ${cli.join(' ')}`);
}

function certificates(dir) {
  const run = (...args) => execFileSync('openssl', args, { cwd: dir, stdio: 'ignore' });
  const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes'];
  run('req', '-x509', ...ec, '-keyout', 'ca.key', '-out', 'ca.crt', '-days', '2', '-subj', '/CN=ratestore test CA');
  run('req', ...ec, '-keyout', 'server.key', '-out', 'server.csr', '-subj', '/CN=localhost');
  writeFileSync(join(dir, 'san.cnf'), 'subjectAltName=IP:127.0.0.1,DNS:localhost\n');
  run('x509', '-req', '-in', 'server.csr', '-CA', 'ca.crt', '-CAkey', 'ca.key', '-CAcreateserial');
  run(
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
 * Starts every server the checks use, on loopback: `{ targets, stop }`, targets as checks.js reads them
 * from RATESTORE_TARGETS.
 */
async function startTargets() {
  const dir = mkdtempSync(join(tmpdir(), 'ratestore-runtimes-'));
  const tls = certificates(dir);
  const port = await freePort();
  const tlsPort = await freePort();
  const socket = join(dir, 'redis.sock');
  await redisServer(['--port', String(port), '--bind', '127.0.0.1', '--unixsocket', socket]);
  await redisServer([
    '--port',
    '0',
    '--tls-port',
    String(tlsPort),
    '--bind',
    '127.0.0.1',
    '--tls-cert-file',
    tls.cert,
    '--tls-key-file',
    tls.key,
    '--tls-ca-cert-file',
    tls.ca,
    '--tls-auth-clients',
    'no',
  ]);
  await waitFor(['-p', String(port)]);
  await waitFor(['--tls', '--cacert', tls.ca, '-p', String(tlsPort)]);
  // A sentinel watching the TCP server, for a redis+sentinel:// target.
  const sentinelPort = await freePort();
  const sentinelConf = join(dir, 'sentinel.conf');
  writeFileSync(
    sentinelConf,
    `port ${sentinelPort}\nbind 127.0.0.1\nprotected-mode no\nsentinel monitor m 127.0.0.1 ${port} 1\n`,
  );
  children.push(spawn('redis-server', [sentinelConf, '--sentinel'], { stdio: 'ignore' }));
  await waitFor(['-p', String(sentinelPort)]);
  const cluster = await startCluster();
  const postgres = await startPostgres();
  const mariadb = await startMariadb();
  const rest = await startRest({ redisPort: port, token: 'runtime-suite-token' });
  const targets = [
    { name: 'tcp', url: `redis://127.0.0.1:${port}` },
    { name: 'tls', url: `rediss://127.0.0.1:${tlsPort}`, ca: tls.ca },
    { name: 'unix', url: `unix://${socket}` },
    { name: 'cluster', url: cluster.url, cluster: true },
    { name: 'rest', url: rest.url, token: rest.token },
    { name: 'sentinel', url: `redis+sentinel://127.0.0.1:${sentinelPort}/m` },
    { name: 'postgres', url: postgres.url, postgres: true },
    { name: 'mysql', url: mariadb.url, mysql: true },
    // One file for the whole suite: the worker threads and the idle child open it as processes on one host do.
    { name: 'sqlite', url: join(dir, 'runtime-suite.sqlite3'), sqlite: true },
  ];
  const stop = async () => {
    await cluster.stop();
    await rest.stop();
    await postgres.stop();
    await mariadb.stop();
    for (const child of children) child.kill('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  };
  return { targets, stop };
}

/**
 * Runs checks.js (`script`, default this folder's) under one runtime (`{ name, path, args }`), `prefix`
 * before its path (an emulator) and `childPrefix` (default `prefix`) before the child process it
 * starts, with `env` added: prints one ok or FAIL line, answers `{ passed, stdout }`.
 */
function runChecks(
  r,
  targets,
  { script = join(__dirname, 'checks.js'), prefix = [], childPrefix = prefix, env = {}, timeout = 300_000 } = {},
) {
  const started = Date.now();
  const [command, ...before] = prefix.length > 0 ? [...prefix, r.path] : [r.path];
  const result = spawnSync(command, [...before, ...r.args, script], {
    env: {
      ...process.env,
      ...env,
      RATESTORE_TARGETS: JSON.stringify(targets),
      RATESTORE_CHILD_PREFIX: JSON.stringify(childPrefix),
    },
    encoding: 'utf8',
    timeout,
  });
  const ok = result.status === 0 && result.signal === null && result.error === undefined;
  const how = result.error
    ? `not run: ${result.error.message}; install the runtimes with node scripts/runtimes.js`
    : result.signal
      ? `killed by ${result.signal}`
      : `exit code ${result.status}`;
  console.log(
    `${ok ? 'ok  ' : 'FAIL'} ${r.name} (${how}, ${Date.now() - started} ms): ${(result.stdout ?? '').trim()}`,
  );
  if (!ok) console.log(result.stderr ?? '');
  return { passed: ok, stdout: result.stdout ?? '' };
}

async function main() {
  const wanted = process.argv.slice(2);
  const all = runtimes();
  const chosen = wanted.length === 0 ? all : all.filter((r) => wanted.includes(r.name));
  if (chosen.length === 0)
    throw new Error(`no runtime named ${wanted.join(', ')}: ${all.map((r) => r.name).join(', ')}`);
  const { targets, stop } = await startTargets();
  let failed = 0;
  try {
    for (const r of chosen) if (!runChecks(r, targets).passed) failed++;
  } finally {
    await stop();
  }
  console.log(`runtime suite: ${chosen.length - failed} of ${chosen.length} runtimes passed`);
  process.exitCode = failed === 0 ? 0 : 1;
}

if (require.main === module) {
  main().catch((error) => {
    console.error(error);
    process.exitCode = 1;
    for (const child of children) child.kill('SIGKILL');
  });
}

module.exports = { startTargets, runChecks, children };
