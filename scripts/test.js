'use strict';
// `npm test` after its set-up: the addon's build where it is missing or older than its sources
// (build-if-needed.js), cargo's tests, and Vitest's suites. Cargo builds its tests from the start at the
// lowest CPU priority (`nice -n 19`), on the CPU time the rest leaves idle: the core that the addon's
// release build leaves idle in its last minute (the whole addon as one LTO unit), then what the suites
// leave. The suites that can share the machine (`__test__/`, three files at a time) and the end-to-end
// suites (`e2e/`, one file at a time) run at once, since both spend their time waiting on servers,
// builds and timers more than on the CPU. Then the suites that must run alone (vitest.config.mjs's
// ALONE: they measure stalls or fill the CPU themselves), with nothing beside them; then cargo's tests,
// already built. The shared suites print as they run; the end-to-end suites' output and a failed cargo
// build's are printed whole once they are done, so that nothing interleaves. Exits 1 if anything failed.

const { spawn, spawnSync } = require('node:child_process');
const { delimiter, dirname, join } = require('node:path');

const root = join(__dirname, '..');

/**
 * On a Node.js older than ratestore's floor (22: a machine's own Node.js 20, say), the suites would fail
 * for want of what 22 has (node:sqlite among them). `npm test` has installed the runtimes pinned in
 * runtimes/ just before (`runtimes.js --ensure`), so it runs again on their Node.js 24, saying so, with
 * that Node.js first on PATH for every process the suites start. Answers the exit code, or undefined to
 * go on here.
 */
function onSupportedNode() {
  const major = Number(process.versions.node.split('.')[0]);
  if (major >= 22 || process.versions.bun !== undefined) return undefined;
  const node = require('./runtimes.js').installed('node24').path;
  console.log(
    `npm test: this is Node.js ${process.version}, and ratestore needs 22 or later: the tests run on the Node.js 24 ` +
      `that npm test installed in runtimes/ (${node})`,
  );
  const env = { ...process.env, PATH: `${dirname(node)}${delimiter}${process.env.PATH ?? ''}` };
  const child = spawnSync(node, [__filename, ...process.argv.slice(2)], { cwd: root, stdio: 'inherit', env });
  if (child.error) throw child.error;
  return child.status ?? 1;
}
const vitest = join(root, 'node_modules', 'vitest', 'vitest.mjs');

/** Runs `command` with `args`: its output to this process's as it comes (`live`), or kept and answered. */
function run(command, args, live) {
  return new Promise((resolve) => {
    const child = spawn(command, args, {
      cwd: root,
      stdio: ['ignore', live ? 'inherit' : 'pipe', live ? 'inherit' : 'pipe'],
    });
    const chunks = [];
    if (!live) {
      child.stdout.on('data', (chunk) => chunks.push(chunk));
      child.stderr.on('data', (chunk) => chunks.push(chunk));
    }
    const done = (ok, code, signal, error) =>
      resolve({ ok, code, signal, output: Buffer.concat([...chunks, Buffer.from(error ? `${error.message}\n` : '')]) });
    child.on('error', (error) => done(false, null, null, error));
    child.on('close', (code, signal) => done(code === 0, code, signal));
  });
}

const vitestRun = (args, live) => run(process.execPath, [vitest, 'run', ...args], live);

/** cargo with `args`, at the lowest CPU priority where `nice` exists (every Unix). */
function lowCargo(args) {
  if (process.platform === 'win32') return run('cargo', args, false);
  return run('nice', ['-n', '19', 'cargo', ...args], false);
}

async function main() {
  const started = Date.now();
  const seconds = () => `${Math.round((Date.now() - started) / 1000)} s`;
  console.log("npm test: cargo's tests build from now on, beside the rest (nice -n 19)");
  const building = lowCargo(['test', '--quiet', '--no-run']).then((result) => {
    console.log(`\nnpm test: cargo's tests built (${seconds()})`);
    return result;
  });
  const addon = await run(process.execPath, [join(__dirname, 'build-if-needed.js')], true);
  if (!addon.ok) {
    console.error('npm test: the addon did not build; no test ran');
    return 1;
  }
  console.log(`npm test: the shared suites (__test__/) and the end-to-end suites (e2e/) at once (${seconds()})`);
  const [shared, e2e, build] = await Promise.all([
    vitestRun(['--project', 'shared'], true),
    vitestRun(['--config', 'vitest.e2e.config.mjs'], false),
    building,
  ]);
  console.log(`\nnpm test: the end-to-end suites (e2e/), run beside the shared suites (${seconds()}):`);
  process.stdout.write(e2e.output);
  console.log(`\nnpm test: the suites that run alone (${seconds()})`);
  const alone = await vitestRun(['--project', 'alone'], true);
  let cargo = build;
  if (build.ok) {
    console.log(`\nnpm test: cargo's tests (${seconds()})`);
    cargo = await run('cargo', ['test', '--quiet'], true);
  } else {
    console.log(`\nnpm test: cargo's tests did not build:`);
    process.stdout.write(build.output);
  }
  const failed = [
    ['the shared suites', shared],
    ['the end-to-end suites', e2e],
    ['the suites that run alone', alone],
    ["cargo's tests", cargo],
  ].filter(([, result]) => !result.ok);
  console.log(`\nnpm test: done in ${seconds()}`);
  for (const [name, result] of failed) {
    console.error(`npm test: ${name} failed (${result.signal ?? `exit code ${result.code}`})`);
  }
  return failed.length === 0 ? 0 : 1;
}

const relaunched = onSupportedNode();
if (relaunched !== undefined) process.exitCode = relaunched;
else main().then((code) => (process.exitCode = code));
