'use strict';
// The release workflow's packaging steps, run on a copy of this checkout with the one binary this
// machine builds: `napi artifacts`, the license copied into each platform package, `napi prepublish`
// (its --dry-run check, then package.json's prepublishOnly, which writes the versions and
// optionalDependencies), then
// `npm pack` of the root package and of the platform package for this machine. Checks each
// tarball's files and manifest as npm would publish them. Nothing is published and the checkout
// is not changed.
//
//   node scripts/release-dry-run.js              needs ratestore.<triple>.node from `npm run build`
//   node scripts/release-dry-run.js --keep       leaves the staged copy and the tarballs in place
//   node scripts/release-dry-run.js --linux DIR  the four Linux binaries from DIR (target/linux, as
//                                                `npm run test:linux` builds them, which runs this):
//                                                each Linux package packed, installed into a fresh
//                                                app by npm for its os, cpu and libc, and loaded by
//                                                index.js's loader on that platform (scripts/linux/
//                                                platforms.js: under qemu-user for arm64)

const { execFileSync } = require('node:child_process');
const {
  copyFileSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  readdirSync,
  rmSync,
  writeFileSync,
} = require('node:fs');
const { tmpdir } = require('node:os');
const { delimiter, dirname, join } = require('node:path');
const { parseTriple } = require('@napi-rs/cli');
const { PUBLISHED, isMusl, platformTriple } = require('../lib/platform.js');

const root = join(__dirname, '..');
const napi = join(root, 'node_modules', '.bin', 'napi');
const triple = platformTriple(process.platform, process.arch, isMusl);
const binaryName = `ratestore.${triple}.node`;
const keep = process.argv.includes('--keep');
const linuxAt = process.argv.indexOf('--linux');
const linuxDir = linuxAt === -1 ? null : process.argv[linuxAt + 1];
const LINUX = ['linux-x64-gnu', 'linux-arm64-gnu', 'linux-x64-musl', 'linux-arm64-musl'];
/** Where the binary for a platform package comes from: the Linux ones from --linux DIR, else this build. */
const sourceOf = (binary) => {
  const linux = LINUX.find((triple) => binary === `ratestore.${triple}.node`);
  if (linuxDir && linux) return join(linuxDir, binary);
  return binary === binaryName ? join(root, binaryName) : null;
};

const failures = [];
function check(condition, what) {
  console.log(`${condition ? 'ok  ' : 'FAIL'} ${what}`);
  if (!condition) failures.push(what);
}
/** What npm should read from a target's platform package, as napi-rs names and fills it. */
function expectedFor(rustTarget) {
  const { platformArchABI, platform, arch, abi } = parseTriple(rustTarget);
  const libc = { gnu: ['glibc'], musl: ['musl'] }[abi];
  return {
    name: `ratestore-${platformArchABI}`,
    binary: `ratestore.${platformArchABI}.node`,
    os: [platform],
    cpu: [arch],
    libc,
  };
}
const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);
const show = (value) => JSON.stringify(value);

function run(command, args, cwd) {
  return execFileSync(command, args, { cwd, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
}

if (!existsSync(sourceOf(binaryName) ?? join(root, binaryName))) {
  console.error(`release-dry-run: no ${binaryName} in the checkout: run \`npm run build\` first`);
  process.exit(1);
}
for (const triple of linuxDir ? LINUX : []) {
  if (!existsSync(join(linuxDir, `ratestore.${triple}.node`))) {
    console.error(`release-dry-run: no ratestore.${triple}.node in ${linuxDir}: run \`npm run test:linux\``);
    process.exit(1);
  }
}
const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'));
const { version } = pkg;
const targets = pkg.napi.targets;

/**
 * Each Linux package as a user gets it: a fresh app, `npm install` of the root tarball for that os, cpu
 * and libc (every platform package points at its tarball through overrides, the others' placeholders
 * too, so that npm chooses among all eight and nothing comes from the registry), then index.js's
 * loader run on that platform.
 */
function installEach(rootTarball, linuxTarballs) {
  const { launcher } = require('./linux/platforms.js');
  const overrides = {};
  for (const target of targets) {
    const { name } = expectedFor(target);
    const packed = name.slice('ratestore-'.length);
    overrides[name] = `file:${linuxTarballs[packed] ?? pack(join(stage, 'npm', packed)).tarball}`;
  }
  for (const triple of LINUX) {
    const target = targets.find((t) => expectedFor(t).name === `ratestore-${triple}`);
    const { os, cpu, libc } = expectedFor(target);
    console.log(`\nratestore-${triple} installed and loaded (${os[0]}, ${cpu[0]}, ${libc[0]})`);
    const app = join(work, `app-${triple}`);
    mkdirSync(app);
    writeFileSync(join(app, 'package.json'), JSON.stringify({ name: 'app', private: true, overrides }, null, 2));
    const flags = [`--os=${os[0]}`, `--cpu=${cpu[0]}`, `--libc=${libc[0]}`];
    run('npm', ['install', '--no-audit', '--no-fund', ...flags, rootTarball], app);
    const chosen = readdirSync(join(app, 'node_modules')).filter((name) => name.startsWith('ratestore-'));
    check(same(chosen, [`ratestore-${triple}`]), `npm install ${flags.join(' ')} chose ${show(chosen)}`);
    writeFileSync(
      join(app, 'load.js'),
      [
        "const ratestore = require('ratestore');",
        "const binary = Object.keys(require.cache).find((file) => file.endsWith('.node'));",
        "ratestore.memoryStore().hit('k', 60000, 1).then((answer) => {",
        '  console.log(JSON.stringify({ arch: process.arch, binary, count: answer.count }));',
        '});',
        '',
      ].join('\n'),
    );
    const { runtime, prefix, env } = launcher(triple);
    const [command, ...before] = [...prefix, runtime.path];
    let loaded = {};
    try {
      const out = execFileSync(command, [...before, ...runtime.args, join(app, 'load.js')], {
        cwd: app,
        env: { ...process.env, ...env },
        encoding: 'utf8',
        stdio: ['ignore', 'pipe', 'pipe'],
        timeout: 300_000,
      });
      loaded = JSON.parse(out.trim().split('\n').pop());
    } catch (error) {
      loaded = {
        error: String(error.stderr || error.message)
          .trim()
          .slice(-2000),
      };
    }
    const want = join('node_modules', `ratestore-${triple}`, `ratestore.${triple}.node`);
    check(
      loaded.arch === cpu[0] && typeof loaded.binary === 'string' && loaded.binary.endsWith(want) && loaded.count === 1,
      `on ${runtime.name}, the loader loads ${want} and a store counts: ${show(loaded)}`,
    );
  }
}

const work = mkdtempSync(join(tmpdir(), 'ratestore-release-'));
const stage = join(work, 'stage');
/** npm pack of the package in `cwd`: its tarball, the files in it and the manifest as npm publishes it. */
function pack(cwd) {
  const [packed] = JSON.parse(run('npm', ['pack', '--json', '--pack-destination', work], cwd));
  const tarball = join(work, packed.filename);
  const files = run('tar', ['-tzf', tarball], work).trim().split('\n').sort();
  const manifest = JSON.parse(run('tar', ['-xzOf', tarball, 'package/package.json'], work));
  return { tarball, files, manifest };
}
try {
  // What a CI checkout holds: the tracked files, and new ones not yet committed.
  const tracked = run('git', ['ls-files', '--cached', '--others', '--exclude-standard', '-z'], root)
    .split('\0')
    .filter((file) => file && existsSync(join(root, file)));
  for (const file of tracked) {
    mkdirSync(dirname(join(stage, file)), { recursive: true });
    copyFileSync(join(root, file), join(stage, file));
  }

  // As the build jobs upload them: one artifact folder per target. The other targets' binaries
  // cannot be built here; placeholders stand in, so that the napi steps see a complete set, and
  // their packages are not packed.
  for (const target of targets) {
    const dir = join(stage, 'artifacts', `bindings-${target}`);
    mkdirSync(dir, { recursive: true });
    const { binary } = expectedFor(target);
    const file = join(dir, binary);
    const source = sourceOf(binary);
    if (source) copyFileSync(source, file);
    else writeFileSync(file, `placeholder for ${target}\n`);
  }
  run(napi, ['artifacts', '--output-dir', 'artifacts', '--npm-dir', 'npm'], stage);
  rmSync(join(stage, 'artifacts'), { recursive: true });
  for (const dir of readdirSync(join(stage, 'npm')))
    copyFileSync(join(stage, 'LICENSE'), join(stage, 'npm', dir, 'LICENSE'));

  run(napi, ['prepublish', '-t', 'npm', '--no-gh-release', '--dry-run'], stage);
  check(true, 'napi prepublish --dry-run passes');
  // The release's own step: package.json's prepublishOnly writes the versions and optionalDependencies.
  const path = `${join(root, 'node_modules', '.bin')}${delimiter}${process.env.PATH}`;
  execFileSync('npm', ['run', '--silent', 'prepublishOnly'], {
    cwd: stage,
    env: { ...process.env, PATH: path },
    stdio: 'pipe',
  });
  check(true, `npm run prepublishOnly (${pkg.scripts.prepublishOnly}) passes`);

  console.log(`\nroot package (ratestore@${version})`);
  const rootPack = pack(stage);
  const libFiles = tracked.filter((file) => /^lib\/.+\.js$/.test(file));
  const expectedRoot = ['LICENSE', 'README.md', 'index.d.ts', 'index.js', 'package.json', ...libFiles]
    .map((file) => `package/${file}`)
    .sort();
  check(same(rootPack.files, expectedRoot), `files: ${show(rootPack.files)}`);
  const missing = rootPack.manifest.files.filter(
    (entry) => !rootPack.files.some((file) => file === `package/${entry}` || file.startsWith(`package/${entry}`)),
  );
  check(missing.length === 0, `every entry of files is packed${missing.length ? `; missing: ${show(missing)}` : ''}`);
  check(rootPack.manifest.name === 'ratestore' && rootPack.manifest.version === version, `version ${version}`);
  check(!rootPack.manifest.os && !rootPack.manifest.cpu && !rootPack.manifest.libc, 'no os, cpu or libc');
  const wanted = Object.fromEntries(PUBLISHED.map((t) => [`ratestore-${t}`, version]).sort());
  const optional = Object.fromEntries(Object.entries(rootPack.manifest.optionalDependencies ?? {}).sort());
  check(same(optional, wanted), `optionalDependencies: every platform package at ${version}: ${show(optional)}`);
  for (const field of ['repository', 'homepage', 'bugs', 'license']) {
    check(rootPack.manifest[field] !== undefined, `${field}: ${show(rootPack.manifest[field])}`);
  }
  check(!rootPack.manifest.scripts?.install && !rootPack.manifest.scripts?.postinstall, 'no install script');

  const platformTarballs = {};
  for (const packed of linuxDir ? LINUX : [triple]) {
    const binary = `ratestore.${packed}.node`;
    console.log(`\nplatform package (ratestore-${packed}@${version})`);
    const platformPack = pack(join(stage, 'npm', packed));
    platformTarballs[packed] = platformPack.tarball;
    const expectedPlatform = ['LICENSE', 'README.md', 'package.json', binary].map((f) => `package/${f}`).sort();
    check(same(platformPack.files, expectedPlatform), `files: ${show(platformPack.files)}`);
    const m = platformPack.manifest;
    check(m.name === `ratestore-${packed}` && m.version === version, `name and version: ${m.name}@${m.version}`);
    check(m.main === binary, `main: ${m.main}`);
    for (const field of ['repository', 'homepage', 'bugs', 'license']) {
      check(same(m[field], pkg[field]), `${field} as in the root package`);
    }
    const own = expectedFor(targets.find((target) => expectedFor(target).binary === binary));
    check(same(m.os, own.os), `os: ${show(m.os)}`);
    check(same(m.cpu, own.cpu), `cpu: ${show(m.cpu)}`);
    check(same(m.libc, own.libc), `libc: ${show(m.libc)}`);
    if (packed !== triple) continue;
    const unpacked = join(work, 'unpacked');
    mkdirSync(unpacked);
    run('tar', ['-xzf', platformPack.tarball, '-C', unpacked], work);
    const binaryVersion = run(
      process.execPath,
      ['-p', `require(${show(join(unpacked, 'package', binary))}).version()`],
      work,
    ).trim();
    check(binaryVersion === version, `the packed binary loads and says version ${binaryVersion}`);
  }

  if (linuxDir) installEach(rootPack.tarball, platformTarballs);

  // Every platform package, as prepublish left it: the fields npm and the loader go by.
  console.log('\nevery platform package');
  for (const target of targets) {
    const want = expectedFor(target);
    const dir = want.name.slice('ratestore-'.length);
    const manifest = JSON.parse(readFileSync(join(stage, 'npm', dir, 'package.json'), 'utf8'));
    const fits =
      manifest.name === want.name &&
      manifest.version === version &&
      manifest.main === want.binary &&
      same(manifest.files, [want.binary]) &&
      same(manifest.os, want.os) &&
      same(manifest.cpu, want.cpu) &&
      same(manifest.libc, want.libc) &&
      same(manifest.repository, pkg.repository);
    const fields = `os ${show(manifest.os)}, cpu ${show(manifest.cpu)}, libc ${show(manifest.libc)}`;
    check(fits, `${manifest.name}@${manifest.version} (${target}): ${fields}`);
  }
  if (keep) console.log(`\nkept: ${work}`);
} catch (error) {
  failures.push(error.message);
  console.error(`FAIL ${error.message}${error.stderr ? `\n${error.stderr}` : ''}`);
} finally {
  if (!keep) rmSync(work, { recursive: true, force: true });
}

if (failures.length) {
  console.error(`\nrelease dry run: ${failures.length} failed`);
  process.exit(1);
}
console.log('\nrelease dry run: ok');
