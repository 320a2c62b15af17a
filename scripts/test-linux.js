'use strict';
// `npm run test:linux`: the four Linux binaries the release publishes (linux-x64-gnu, linux-arm64-gnu,
// linux-x64-musl, linux-arm64-musl), built here exactly as .github/workflows/ci.yml builds them
// (cargo-zigbuild, the glibc ones against glibc 2.17) and checked:
//
// - glibc 2.17 floor: the highest GLIBC_ version each glibc binary needs, and the libraries it needs;
// - musl: no glibc, libstdc++ or libgcc_s dependency, and every undefined symbol resolved by musl's
//   libc.so (Debian's musl, for each CPU) or Node-API;
// - each binary loaded by index.js's loader (which must pick it by os, cpu and libc) and the runtime
//   suite's checks run with it (__test__/runtimes/checks.js: every store and transport, worker
//   threads, an idle process exiting by itself) against redis-server and PostgreSQL on loopback:
//   linux-x64-gnu on Node.js 24; linux-arm64-gnu on Node.js 24 for arm64 under qemu-user, with
//   Debian's arm64 glibc; linux-x64-musl on Bun's musl build, in a mount namespace whose /usr/bin/ldd
//   is musl's (as on Alpine); linux-arm64-musl on Bun's arm64 musl build under qemu-user, in a root
//   holding only Debian's arm64 musl. Bun's musl builds need a musl libstdc++.so.6, which Debian does
//   not ship: scripts/linux/libstdcxx-musl.cc is built with zig into one.
//
// What it needs it installs where it can (as root, or with sudo): Debian's qemu-user-static, arm64
// glibc and musl; cargo-zigbuild and ziglang from PyPI at the versions ci.yml pins; the Rust targets
// (rustup); the runtimes pinned in runtimes/linux/package-lock.json (npm). Everything it makes stays
// in target/linux, and a binary newer than the Rust sources is not built again.
//
//   node scripts/test-linux.js                   prints an ok or FAIL line per check, the time of each
//                                                part, and "test:linux: N passed, N failed"
//   node scripts/test-linux.js linux-arm64-musl  builds and checks only the targets named

const { execFileSync, spawnSync } = require('node:child_process');
const {
  chmodSync,
  copyFileSync,
  cpSync,
  existsSync,
  mkdirSync,
  readFileSync,
  readdirSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
} = require('node:fs');
const { join } = require('node:path');
const {
  ROOT,
  OUT,
  RUNTIMES,
  TARGETS,
  MUSL_X64_ROOT,
  MUSL_ARM64_ROOT,
  runtimePaths,
  launcher,
} = require('./linux/platforms.js');

const root = process.getuid() === 0;
const binaryOf = (t) => join(OUT, `ratestore.${t.triple}.node`);

let passed = 0;
let failed = 0;
function check(condition, what) {
  console.log(`${condition ? 'ok  ' : 'FAIL'} ${what}`);
  if (condition) passed++;
  else failed++;
  return condition;
}

const timings = [];
async function part(name, fn) {
  console.log(`\n--- ${name}`);
  const started = Date.now();
  try {
    return await fn();
  } finally {
    const seconds = Math.round((Date.now() - started) / 1000);
    timings.push([name, seconds]);
    console.log(`--- ${name}: ${seconds} s`);
  }
}

function run(command, args, options = {}) {
  return execFileSync(command, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'], ...options });
}
function runLoud(command, args, options = {}) {
  execFileSync(command, args, { stdio: 'inherit', ...options });
}

// ---------------------------------------------------------------------------------------------------
// What ci.yml pins and how it builds each Linux target, read from it so that the two cannot part.

function fromWorkflow() {
  const yml = readFileSync(join(ROOT, '.github', 'workflows', 'ci.yml'), 'utf8');
  const pin = (name) => {
    const found = new RegExp(`${name}==([0-9][^\\s'"]*)`).exec(yml);
    if (!found) throw new Error(`.github/workflows/ci.yml pins no ${name} version`);
    return found[1];
  };
  const builds = {};
  for (const [, target, args] of yml.matchAll(/- target: (\S+)\n\s+host: \S+\n\s+build: (.+)\n/g)) {
    builds[target] = args.trim().split(/\s+/);
  }
  for (const t of TARGETS) {
    if (!builds[t.rust]) throw new Error(`.github/workflows/ci.yml has no build arguments for ${t.rust}`);
  }
  return { zigbuild: pin('cargo-zigbuild'), zig: pin('ziglang'), builds };
}

// ---------------------------------------------------------------------------------------------------
// Set-up.

const APT = ['qemu-user-static', 'libc6-arm64-cross', 'libstdc++6-arm64-cross', 'libgcc-s1-arm64-cross', 'musl', 'g++'];

/** As .ci/run installs: as root, or with passwordless sudo; else one message with the command. */
function aptInstall(packages) {
  const sudo = root ? [] : ['sudo', '-n'];
  if (!root && spawnSync('sudo', ['-n', 'true'], { stdio: 'ignore' }).status !== 0) {
    throw new Error(`missing Debian packages; install them with: apt-get install ${packages.join(' ')}`);
  }
  const apt = (...args) => runLoud(sudo[0] ?? 'apt-get', [...sudo.slice(1), ...(root ? [] : ['apt-get']), ...args]);
  apt('update', '-qq');
  apt('install', '-y', '-qq', ...packages);
}

function dpkgInstalled(name) {
  const result = spawnSync('dpkg-query', ['-W', '-f=${Status}', name], { encoding: 'utf8' });
  return result.status === 0 && result.stdout.includes('install ok installed');
}

/** Debian's musl for arm64, unpacked (not installed): its loader and libc.so, for the arm64 musl root. */
function arm64Musl(dir) {
  const libc = join(dir, 'lib', 'aarch64-linux-musl', 'libc.so');
  if (existsSync(libc)) return;
  // A private apt state that also lists arm64, so that the machine's own apt set-up is left as it is.
  const state = join(OUT, 'apt');
  for (const sub of ['lists/partial', 'cache/archives/partial']) mkdirSync(join(state, sub), { recursive: true });
  const options = [
    '-o',
    `Dir::State::Lists=${join(state, 'lists')}`,
    '-o',
    `Dir::Cache=${join(state, 'cache')}`,
    '-o',
    'APT::Architectures::=arm64',
    '-qq',
  ];
  runLoud('apt-get', [...options, 'update']);
  runLoud('apt-get', [...options, 'download', 'musl:arm64'], { cwd: state });
  const deb = readdirSync(state).find((f) => /^musl_.*_arm64\.deb$/.test(f));
  if (!deb) throw new Error('apt-get download musl:arm64 left no .deb');
  mkdirSync(dir, { recursive: true });
  runLoud('dpkg-deb', ['-x', join(state, deb), dir]);
}

function setup(pins) {
  const missing = APT.filter((name) => !dpkgInstalled(name));
  if (missing.length > 0) {
    console.log(`installing Debian packages: ${missing.join(' ')}`);
    aptInstall(missing);
  }
  check(APT.every(dpkgInstalled), `Debian packages: ${APT.join(', ')}`);

  const version = (command, args) => {
    try {
      return run(command, args).trim();
    } catch {
      return '';
    }
  };
  const zigbuildOk = () => version('cargo-zigbuild', ['--version']) === `cargo-zigbuild ${pins.zigbuild}`;
  const zigOk = () => version('python3', ['-m', 'ziglang', 'version']) === pins.zig;
  if (!zigbuildOk() || !zigOk()) {
    runLoud('python3', [
      '-m',
      'pip',
      'install',
      '--quiet',
      '--only-binary',
      ':all:',
      `cargo-zigbuild==${pins.zigbuild}`,
      `ziglang==${pins.zig}`,
    ]);
  }
  check(zigbuildOk() && zigOk(), `cargo-zigbuild ${pins.zigbuild} and ziglang ${pins.zig} (PyPI, as ci.yml pins them)`);

  const installedTargets = () => run('rustup', ['target', 'list', '--installed']).split('\n');
  const wanted = TARGETS.map((t) => t.rust).filter((t) => !installedTargets().includes(t));
  if (wanted.length > 0) runLoud('rustup', ['target', 'add', ...wanted]);
  check(
    TARGETS.every((t) => installedTargets().includes(t.rust)),
    `Rust targets: ${TARGETS.map((t) => t.rust).join(', ')}`,
  );

  const paths = runtimePaths();
  if (!Object.values(paths).every(existsSync)) {
    // --force: npm would otherwise refuse packages made for another CPU or libc than this machine's.
    runLoud('npm', ['ci', '--prefix', RUNTIMES, '--force', '--no-audit', '--no-fund', '--loglevel', 'error']);
  }
  check(Object.values(paths).every(existsSync), 'runtimes pinned in runtimes/linux/package-lock.json');
  if (!existsSync(join(ROOT, 'node_modules', 'express-rate-limit'))) {
    runLoud('npm', ['ci', '--no-audit', '--no-fund'], { cwd: ROOT });
  }
  arm64Musl(MUSL_ARM64_ROOT);
  check(existsSync(join(MUSL_ARM64_ROOT, 'lib', 'ld-musl-aarch64.so.1')), "Debian's musl for arm64, unpacked");
}

// ---------------------------------------------------------------------------------------------------
// Builds.

function newest(path) {
  const stat = statSync(path);
  if (!stat.isDirectory()) return stat.mtimeMs;
  return Math.max(0, ...readdirSync(path).map((name) => newest(join(path, name))));
}
const sources = () =>
  Math.max(
    ...['src', 'Cargo.toml', 'Cargo.lock', 'build.rs']
      .filter((p) => existsSync(join(ROOT, p)))
      .map((p) => newest(join(ROOT, p))),
  );

async function build(t, args) {
  const file = binaryOf(t);
  const command = ['run', 'build', '--', ...args, '--output-dir', OUT];
  if (existsSync(file) && statSync(file).mtimeMs > sources()) {
    console.log(`${t.triple}: target/linux/${t.triple} is newer than the Rust sources, not built again`);
    return;
  }
  await part(`build ${t.triple} (npm ${command.join(' ')})`, () => {
    rmSync(file, { force: true });
    runLoud('npm', command, { cwd: ROOT });
  });
}

// ---------------------------------------------------------------------------------------------------
// What each binary needs from the system.

/** The dynamic section's NEEDED entries, the GLIBC_ versions it needs, and its undefined symbols. */
function elf(file) {
  const dynamic = run('readelf', ['-d', '-W', file]);
  const needed = [...dynamic.matchAll(/\(NEEDED\)\s+Shared library: \[([^\]]+)\]/g)].map((m) => m[1]);
  const versions = [...run('readelf', ['-V', '-W', file]).matchAll(/Name: (GLIBC_[0-9.]+)/g)].map((m) => m[1]);
  const header = run('readelf', ['-h', '-W', file]);
  const machine = /Machine:\s+(.+)/.exec(header)[1].trim();
  const undefinedSymbols = [];
  for (const line of run('readelf', ['--dyn-syms', '-W', file]).split('\n')) {
    const cols = line.trim().split(/\s+/);
    // Num: Value Size Type Bind Vis Ndx Name
    if (cols.length >= 8 && cols[6] === 'UND' && cols[7]) {
      undefinedSymbols.push({ name: cols[7].replace(/@.*$/, ''), weak: cols[4] === 'WEAK' });
    }
  }
  return { needed, versions, machine, undefinedSymbols };
}

const compareVersions = (a, b) => {
  const pa = a.split('.').map(Number);
  const pb = b.split('.').map(Number);
  for (let i = 0; i < Math.max(pa.length, pb.length); i++) {
    if ((pa[i] ?? 0) !== (pb[i] ?? 0)) return (pa[i] ?? 0) - (pb[i] ?? 0);
  }
  return 0;
};
const MACHINE = { x64: 'Advanced Micro Devices X86-64', arm64: 'AArch64' };
const GLIBC_LIBS =
  /^(libc\.so\.6|libm\.so\.6|libdl\.so\.2|libpthread\.so\.0|librt\.so\.1|libgcc_s\.so\.1|ld-linux-(x86-64|aarch64)\.so\.[12])$/;

function glibcFloor(t) {
  const info = elf(binaryOf(t));
  check(info.machine === MACHINE[t.cpu], `${t.triple}: an ${info.machine} binary`);
  const numbers = info.versions.map((v) => v.slice('GLIBC_'.length)).sort(compareVersions);
  const highest = numbers.length > 0 ? `GLIBC_${numbers.at(-1)}` : 'none';
  check(
    numbers.length > 0 && compareVersions(numbers.at(-1), '2.17') <= 0,
    `${t.triple}: the highest glibc symbol version it needs is ${highest} (floor: GLIBC_2.17)`,
  );
  check(
    info.needed.every((lib) => GLIBC_LIBS.test(lib)),
    `${t.triple}: it needs glibc's libraries only: ${info.needed.join(', ')}`,
  );
}

function definedSymbols(library) {
  const names = new Set();
  for (const line of run('readelf', ['--dyn-syms', '-W', library]).split('\n')) {
    const cols = line.trim().split(/\s+/);
    if (cols.length >= 8 && cols[6] !== 'UND' && /^[0-9]+:$/.test(cols[0])) names.add(cols[7].replace(/@.*$/, ''));
  }
  return names;
}

function muslOnly(t, muslLibc) {
  const info = elf(binaryOf(t));
  check(info.machine === MACHINE[t.cpu], `${t.triple}: an ${info.machine} binary`);
  check(
    info.needed.length > 0 && info.needed.every((lib) => /^libc\.(so|musl-[a-z0-9_]+\.so\.1)$/.test(lib)),
    `${t.triple}: it needs musl's libc only: ${info.needed.join(', ')} (no libc.so.6, libstdc++ or libgcc_s)`,
  );
  check(info.versions.length === 0, `${t.triple}: no GLIBC_ symbol version (${info.versions.length} found)`);
  const musl = definedSymbols(muslLibc);
  const napi = (s) => /^(napi|node_api)_/.test(s.name);
  const fromMusl = info.undefinedSymbols.filter((s) => musl.has(s.name));
  const nodeApi = info.undefinedSymbols.filter((s) => !musl.has(s.name) && napi(s));
  const other = info.undefinedSymbols.filter((s) => !musl.has(s.name) && !napi(s));
  // A weak reference may stay unresolved (the loader makes it null): Rust's std asks for glibc's
  // __cxa_thread_atexit_impl that way, and registers thread-local destructors itself without it.
  const weak = other.filter((s) => s.weak);
  const strong = other.filter((s) => !s.weak);
  check(
    strong.length === 0,
    `${t.triple}: its ${info.undefinedSymbols.length} undefined symbols resolve to musl's libc.so (${fromMusl.length}) ` +
      `or Node-API (${nodeApi.length})` +
      (weak.length ? `, but for ${weak.length} weak: ${weak.map((s) => s.name).join(', ')}` : '') +
      (strong.length ? `; unresolved: ${strong.map((s) => s.name).join(', ')}` : ''),
  );
}

// ---------------------------------------------------------------------------------------------------
// A musl libstdc++.so.6 for Bun's musl builds, and the roots they run in.

const SHIM = join(__dirname, 'linux', 'libstdcxx-musl.cc');
// LLVM's libc++abi sources that zig ships, compiled into the library with default visibility.
const CXXABI = [
  'private_typeinfo',
  'cxa_guard',
  'cxa_demangle',
  'cxa_virtual',
  'cxa_aux_runtime',
  'stdlib_typeinfo',
  'stdlib_exception',
  'abort_message',
];

function zigLib() {
  const env = run('python3', ['-m', 'ziglang', 'env']);
  const found = /lib_dir"?\s*[:=]\s*"([^"]+)"/.exec(env);
  if (!found) throw new Error(`zig env says no lib_dir: ${env}`);
  return found[1];
}

function libstdcxx(zigTarget, dir) {
  const out = join(dir, 'libstdc++.so.6');
  if (existsSync(out) && statSync(out).mtimeMs > statSync(SHIM).mtimeMs) return out;
  const lib = zigLib();
  const objects = join(OUT, `cxxabi-${zigTarget}`);
  mkdirSync(objects, { recursive: true });
  mkdirSync(dir, { recursive: true });
  const flags = ['-target', zigTarget, '-fPIC', '-O2', '-std=c++20', '-fno-exceptions'];
  for (const name of CXXABI) {
    const object = join(objects, `${name}.o`);
    if (existsSync(object)) continue;
    runLoud('python3', [
      '-m',
      'ziglang',
      'c++',
      ...flags,
      '-c',
      '-D_LIBCXXABI_BUILDING_LIBRARY',
      '-D_LIBCXXABI_NO_EXCEPTIONS',
      `-I${join(lib, 'libcxxabi', 'include')}`,
      `-I${join(lib, 'libcxx', 'src')}`,
      '-o',
      object,
      join(lib, 'libcxxabi', 'src', `${name}.cpp`),
    ]);
  }
  runLoud('python3', [
    '-m',
    'ziglang',
    'c++',
    ...flags,
    '-shared',
    '-nostdlib++',
    '-Wl,-soname,libstdc++.so.6',
    '-Wl,--no-undefined',
    '-o',
    out,
    SHIM,
    ...CXXABI.map((name) => join(objects, `${name}.o`)),
  ]);
  return out;
}

/**
 * libstdcxx-musl-check.cc, built with g++ against libstdc++'s headers and that file's definitions:
 * std::set, std::list, std::unordered_map, std::condition_variable and std::call_once as Bun uses them.
 */
function libstdcxxAgrees() {
  const dir = join(OUT, 'libstdcxx-check');
  mkdirSync(dir, { recursive: true });
  const program = join(dir, 'check');
  run('g++', ['-O1', '-pthread', '-o', program, join(__dirname, 'linux', 'libstdcxx-musl-check.cc'), SHIM]);
  const result = spawnSync(program, { encoding: 'utf8', timeout: 60_000 });
  check(
    result.status === 0,
    `libstdcxx-musl.cc's std::set (a red-black tree), std::list, std::unordered_map, condition_variable and ` +
      `call_once agree with a model: ${(result.stdout ?? '').trim() || result.signal || result.error?.message}`,
  );
}

/** Alpine's ldd: the loader's own --list, which is how ratestore's loader tells musl from glibc. */
function muslLdd(file, loader) {
  mkdirSync(join(file, '..'), { recursive: true });
  writeFileSync(file, `#!/bin/sh\nexec ${loader} --list "$@"\n`);
  chmodSync(file, 0o755);
}

function bunNeeds(bun, muslLibc, shim) {
  const info = elf(bun);
  const defined = new Set([...definedSymbols(muslLibc), ...definedSymbols(shim)]);
  const missing = info.undefinedSymbols.filter((s) => !s.weak && !defined.has(s.name)).map((s) => s.name);
  return { needed: info.needed, missing };
}

// ---------------------------------------------------------------------------------------------------
// An app per target: the package as a user gets it (index.js, lib/, package.json) with that one binary
// beside it, and the runtime suite's files; node_modules (express, express-rate-limit) is this checkout's.

function stage(t) {
  const dir = join(OUT, `app-${t.triple}`);
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(join(dir, '__test__'), { recursive: true });
  for (const file of ['index.js', 'package.json']) copyFileSync(join(ROOT, file), join(dir, file));
  cpSync(join(ROOT, 'lib'), join(dir, 'lib'), { recursive: true });
  cpSync(join(ROOT, '__test__', 'runtimes'), join(dir, '__test__', 'runtimes'), { recursive: true });
  copyFileSync(binaryOf(t), join(dir, `ratestore.${t.triple}.node`));
  symlinkSync(join(ROOT, 'node_modules'), join(dir, 'node_modules'));
  return dir;
}

// ---------------------------------------------------------------------------------------------------

async function main() {
  const started = Date.now();
  const pins = fromWorkflow();
  const wanted = process.argv.slice(2);
  const unknown = wanted.filter((name) => !TARGETS.some((t) => t.triple === name));
  if (unknown.length > 0)
    throw new Error(`no target ${unknown.join(', ')}: ${TARGETS.map((t) => t.triple).join(', ')}`);
  const chosen = TARGETS.filter((t) => wanted.length === 0 || wanted.includes(t.triple));
  await part('set-up (Debian packages, PyPI, rustup, npm runtimes)', () => setup(pins));

  for (const t of chosen) await build(t, pins.builds[t.rust]);
  for (const t of chosen)
    check(existsSync(binaryOf(t)), `${t.triple}: built (target/linux/ratestore.${t.triple}.node)`);

  const paths = runtimePaths();
  const muslX64Libc = '/lib/x86_64-linux-musl/libc.so';
  const muslArm64Libc = join(MUSL_ARM64_ROOT, 'lib', 'aarch64-linux-musl', 'libc.so');
  await part('what each binary needs (readelf)', () => {
    for (const t of chosen) {
      if (t.libc === 'glibc') glibcFloor(t);
      else muslOnly(t, t.cpu === 'x64' ? muslX64Libc : muslArm64Libc);
    }
  });

  if (chosen.some((t) => t.libc === 'musl')) {
    await part('a musl libstdc++.so.6 for Bun (zig)', () => {
      libstdcxxAgrees();
      const x64 = libstdcxx('x86_64-linux-musl', join(MUSL_X64_ROOT, 'lib'));
      const arm64 = libstdcxx('aarch64-linux-musl', join(MUSL_ARM64_ROOT, 'usr', 'lib', 'aarch64-linux-musl'));
      muslLdd(join(MUSL_X64_ROOT, 'usr', 'bin', 'ldd'), '/lib/ld-musl-x86_64.so.1');
      muslLdd(join(MUSL_ARM64_ROOT, 'usr', 'bin', 'ldd'), '/lib/ld-musl-aarch64.so.1');
      for (const [name, bun, libc, shim] of [
        ['x64', paths.bunX64Musl, muslX64Libc, x64],
        ['arm64', paths.bunArm64Musl, muslArm64Libc, arm64],
      ]) {
        const { needed, missing } = bunNeeds(bun, libc, shim);
        check(
          missing.length === 0,
          `Bun's ${name} musl build (needs ${needed.join(', ')}): every symbol it needs is in musl or that libstdc++.so.6` +
            (missing.length ? `; missing: ${missing.join(', ')}` : ''),
        );
      }
    });
  }

  const { startTargets, runChecks } = require('../__test__/runtimes/run.js');
  const servers = await part('servers (redis-server, a cluster, sentinel, REST, PostgreSQL, MariaDB)', () =>
    startTargets(),
  );
  try {
    for (const t of chosen) {
      const app = stage(t);
      const { runtime, prefix, childPrefix, env } = launcher(t.triple);
      await part(`runtime suite: ${t.triple} on ${runtime.name}`, () => {
        const ok = runChecks(runtime, servers.targets, {
          script: join(app, '__test__', 'runtimes', 'checks.js'),
          prefix,
          childPrefix,
          env,
          timeout: 900_000,
        });
        check(
          ok.passed && ok.stdout.includes(` ${t.cpu} (ratestore.${t.triple}.node)`),
          `${t.triple}: chosen by index.js's loader on ${t.cpu} ${t.libc}, and the runtime suite's checks pass on ${runtime.name}`,
        );
      });
    }
  } finally {
    await servers.stop();
  }

  if (chosen.length === TARGETS.length) {
    await part('release dry run (scripts/release-dry-run.js --linux target/linux)', () => {
      const result = spawnSync(process.execPath, [join(__dirname, 'release-dry-run.js'), '--linux', OUT], {
        cwd: ROOT,
        encoding: 'utf8',
        timeout: 1_800_000,
      });
      process.stdout.write(result.stdout ?? '');
      process.stderr.write(result.stderr ?? '');
      // Each of its ok and FAIL lines counts as one check here.
      passed += (result.stdout.match(/^ok {3}/gm) ?? []).length;
      failed += (result.stdout.match(/^FAIL /gm) ?? []).length;
      check(result.status === 0, `release dry run exits 0 (${result.error?.message ?? `exit code ${result.status}`})`);
    });
  }

  console.log('\ntimes:');
  for (const [name, seconds] of timings) console.log(`  ${String(seconds).padStart(5)} s  ${name}`);
  console.log(`  ${String(Math.round((Date.now() - started) / 1000)).padStart(5)} s  in all`);
  console.log(`test:linux: ${passed} passed, ${failed} failed`);
  process.exitCode = failed === 0 ? 0 : 1;
}

main().catch((error) => {
  console.error(error);
  for (const child of require('../__test__/runtimes/run.js').children) child.kill('SIGKILL');
  console.log(`test:linux: ${passed} passed, ${failed + 1} failed`);
  process.exitCode = 1;
});
