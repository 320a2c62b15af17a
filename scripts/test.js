'use strict';
// The Vitest part of `npm test`, after its set-up and cargo's tests: the suites that can share the
// machine (`__test__/`, three files at a time) and the end-to-end suites (`e2e/`, one file at a time) run
// at once, since both spend their time waiting on servers, builds and timers more than on the CPU; then
// the suites that must run alone (vitest.config.mjs's ALONE: they measure stalls or fill the CPU
// themselves), with nothing beside them. The shared suites print as they run; the end-to-end suites'
// output is printed whole once both are done, so that the two do not interleave. Exits 1 if any failed.

const { spawn } = require('node:child_process');
const { join } = require('node:path');

const root = join(__dirname, '..');
const vitest = join(root, 'node_modules', 'vitest', 'vitest.mjs');

/** Runs Vitest with `args`: its output to this process's as it comes (`live`), or kept and answered. */
function run(args, live) {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [vitest, 'run', ...args], {
      cwd: root,
      stdio: ['ignore', live ? 'inherit' : 'pipe', live ? 'inherit' : 'pipe'],
    });
    const chunks = [];
    if (!live) {
      child.stdout.on('data', (chunk) => chunks.push(chunk));
      child.stderr.on('data', (chunk) => chunks.push(chunk));
    }
    child.on('close', (code, signal) => resolve({ ok: code === 0, code, signal, output: Buffer.concat(chunks) }));
  });
}

async function main() {
  const started = Date.now();
  const seconds = () => `${Math.round((Date.now() - started) / 1000)} s`;
  console.log('npm test: the shared suites (__test__/) and the end-to-end suites (e2e/) at once');
  const [shared, e2e] = await Promise.all([
    run(['--project', 'shared'], true),
    run(['--config', 'vitest.e2e.config.mjs'], false),
  ]);
  console.log(`\nnpm test: the end-to-end suites (e2e/), run beside the shared suites (${seconds()}):`);
  process.stdout.write(e2e.output);
  console.log(`\nnpm test: the suites that run alone (${seconds()})`);
  const alone = await run(['--project', 'alone'], true);
  const failed = [
    ['the shared suites', shared],
    ['the end-to-end suites', e2e],
    ['the suites that run alone', alone],
  ].filter(([, result]) => !result.ok);
  console.log(`\nnpm test: done in ${seconds()}`);
  for (const [name, result] of failed) {
    console.error(`npm test: ${name} failed (${result.signal ?? `exit code ${result.code}`})`);
  }
  return failed.length === 0 ? 0 : 1;
}

main().then((code) => (process.exitCode = code));
