'use strict';
// `npm test` after its set-up (scripts/setup-system.js, the release build), in three parts:
//
// 1. At once, in two groups:
//    - the suites that share the machine (vitest.config.mjs's `shared` project: `__test__/`, three
//      files at a time), some of whose tests check real-time bounds;
//    - at nice 5, below them: the end-to-end suites (`e2e/`, their three files at a time: npm packs
//      and installs, Next.js builds, the benchmark's smoke runs on Bun and Deno), after the runtimes
//      they start (installed from `runtimes/` where missing), and the `background`
//      project (the differential suite: a core's worth of model checking, with measured slack); and,
//      at the lowest CPU priority (SCHED_IDLE: only what everything else leaves idle), the builds the
//      later parts need: cargo's test binaries, then better-sqlite3 (the benchmark's SQLite peer).
// 2. cargo's tests (unit tests, the Lua scripts' twins against a real redis-server).
// 3. The suites that must run alone (the `alone` project: they measure stalls or fill the CPU
//    themselves), with nothing beside them.
//
// The shared suites print as they run; the other output of part 1 is printed whole once it is done,
// so that nothing interleaves. Exits 1 if anything failed.

const { spawn, spawnSync } = require('node:child_process');
const { join } = require('node:path');

const root = join(__dirname, '..');
const vitest = join(root, 'node_modules', 'vitest', 'vitest.mjs');

/**
 * Runs `command args`: its output to this process's as it comes (`live`), or kept and answered; `idle`:
 * at the lowest CPU priority; `nice`: at that nice value.
 */
function run(command, args, { live = false, idle = false, nice = 0 } = {}) {
  let [file, argv] = [command, args];
  if (idle) [file, argv] = lowestPriority(command, args);
  else if (nice > 0) [file, argv] = ['nice', ['-n', String(nice), command, ...args]];
  return new Promise((resolve) => {
    const child = spawn(file, argv, {
      cwd: root,
      stdio: ['ignore', live ? 'inherit' : 'pipe', live ? 'inherit' : 'pipe'],
    });
    const chunks = [];
    if (!live) {
      child.stdout.on('data', (chunk) => chunks.push(chunk));
      child.stderr.on('data', (chunk) => chunks.push(chunk));
    }
    child.on('error', (error) => chunks.push(Buffer.from(`${error.message}\n`)));
    child.on('close', (code, signal) => resolve({ ok: code === 0, code, signal, output: Buffer.concat(chunks) }));
  });
}

/** `command args` under SCHED_IDLE (util-linux's chrt), else at nice 19. */
function lowestPriority(command, args) {
  if (spawnSync('chrt', ['--idle', '0', 'true']).status === 0) return ['chrt', ['--idle', '0', command, ...args]];
  return ['nice', ['-n', '19', command, ...args]];
}

const vitestRun = (args, options) => run(process.execPath, [vitest, 'run', ...args], options);

/** The builds of parts 2 and 3, one after the other: cargo's test binaries, then better-sqlite3. */
async function builds() {
  const cargo = await run('cargo', ['test', '--no-run', '--quiet'], { idle: true });
  const sqlite = await run(process.execPath, [join(root, 'benchmark', 'sqlite.js'), '--build'], { idle: true });
  return { cargo, sqlite };
}

/**
 * The end-to-end suites, after the runtimes they start (Node.js 22/24/26, Bun and Deno from `runtimes/`),
 * installed first where missing: only they need them, so the shared suites do not wait for that.
 */
async function endToEnd() {
  const ensured = await run(process.execPath, [join(root, 'scripts', 'runtimes.js'), '--ensure']);
  if (!ensured.ok) return ensured;
  const e2e = await vitestRun(['--config', 'vitest.e2e.config.mjs'], { nice: 5 });
  return { ...e2e, output: Buffer.concat([ensured.output, e2e.output]) };
}

async function main() {
  const started = Date.now();
  const seconds = () => `${Math.round((Date.now() - started) / 1000)} s`;
  console.log(
    "npm test: the shared suites (__test__/) at once with, at a lower CPU priority, the end-to-end (e2e/) and background suites, and cargo's test build and better-sqlite3's at the lowest",
  );
  const building = builds();
  const [shared, e2e, background] = await Promise.all([
    vitestRun(['--project', 'shared'], { live: true }),
    endToEnd(),
    vitestRun(['--project', 'background'], { nice: 5 }),
  ]);
  console.log(`\nnpm test: the end-to-end suites (e2e/), run beside the shared suites (${seconds()}):`);
  process.stdout.write(e2e.output);
  console.log(`\nnpm test: the background suites, run beside the shared suites (${seconds()}):`);
  process.stdout.write(background.output);
  const built = await building;
  console.log(`\nnpm test: the builds, done (${seconds()})`);
  process.stdout.write(Buffer.concat([built.cargo.output, built.sqlite.output]));
  console.log(`\nnpm test: cargo's tests (${seconds()})`);
  const cargo = built.cargo.ok ? await run('cargo', ['test', '--quiet'], { live: true }) : built.cargo;
  console.log(`\nnpm test: the suites that run alone (${seconds()})`);
  const alone = await vitestRun(['--project', 'alone'], { live: true });
  const failed = [
    ['the shared suites', shared],
    ['the end-to-end suites', e2e],
    ['the background suites', background],
    ["cargo's tests", cargo],
    ["better-sqlite3's build", built.sqlite],
    ['the suites that run alone', alone],
  ].filter(([, result]) => !result.ok);
  console.log(`\nnpm test: done in ${seconds()}`);
  for (const [name, result] of failed) {
    console.error(`npm test: ${name} failed (${result.signal ?? `exit code ${result.code}`})`);
  }
  return failed.length === 0 ? 0 : 1;
}

main().then((code) => (process.exitCode = code));
