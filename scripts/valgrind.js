'use strict';
// `npm run test:valgrind`: runs the native-safety scenarios (memoryStore with
// its numbers detached and transferred, worker threads on one named store,
// redisStore with its results detached and a settle that throws) under
// valgrind's memcheck, and fails on any invalid read or write. Leaks are not
// counted: V8 and Node keep memory to the end by design.
const { spawn, spawnSync } = require('node:child_process');
const { join } = require('node:path');
const { freePort } = require('./free-port.js');

const fixture = join(__dirname, '..', '__test__', 'fixtures', 'native-safety.js');

function need(command, install) {
  if (spawnSync(command, ['--version'], { stdio: 'ignore' }).error) {
    console.error(`test:valgrind: ${command} was not found on PATH; install it with ${install}.`);
    process.exit(1);
  }
}

function underValgrind(args) {
  const started = Date.now();
  const valgrind = [
    '--tool=memcheck',
    '--error-exitcode=97',
    '--leak-check=no',
    // V8 writes machine code at run time.
    '--smc-check=all-non-file',
    `--suppressions=${join(__dirname, 'valgrind.supp')}`,
    process.execPath,
    '--expose-gc',
    fixture,
    ...args,
  ];
  const run = spawnSync('valgrind', valgrind, { encoding: 'utf8', timeout: 600_000 });
  const report = run.stderr.split('\n').filter((line) => /^==\d+== /.test(line));
  const invalid = report.filter((line) => /Invalid (read|write)|uninitialised|Invalid free|Mismatched free/.test(line));
  const seconds = ((Date.now() - started) / 1000).toFixed(1);
  if (run.status !== 0 || invalid.length > 0) {
    console.error(run.stdout, report.join('\n'));
    console.error(
      `test:valgrind: ${args[0]}: FAILED (exit ${run.status}, ${invalid.length} invalid accesses) in ${seconds} s`,
    );
    return false;
  }
  console.log(`test:valgrind: ${args[0]}: no invalid read or write (${seconds} s): ${run.stdout.trim()}`);
  return true;
}

async function withRedis(body) {
  const port = await freePort();
  const server = spawn(
    'redis-server',
    ['--bind', '127.0.0.1', '--port', String(port), '--save', '', '--appendonly', 'no'],
    {
      stdio: ['ignore', 'pipe', 'inherit'],
    },
  );
  await new Promise((resolve, reject) => {
    let output = '';
    server.once('error', reject);
    server.stdout.on('data', (chunk) => {
      output += chunk;
      if (output.includes('Ready to accept connections')) resolve();
    });
  });
  server.stdout.resume();
  try {
    return body(`redis://127.0.0.1:${port}`);
  } finally {
    server.kill('SIGKILL');
  }
}

async function main() {
  need('valgrind', '`apt-get install valgrind`');
  need('redis-server', '`apt-get install redis-server`');
  const results = [underValgrind(['memory']), underValgrind(['workers'])];
  results.push(await withRedis((url) => underValgrind(['redis', url])));
  const passed = results.filter(Boolean).length;
  console.log(`test:valgrind: ${passed} passed, ${results.length - passed} failed`);
  process.exit(passed === results.length ? 0 : 1);
}

main();
