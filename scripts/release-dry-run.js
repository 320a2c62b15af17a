'use strict';
// The release workflow's packaging steps, run on a copy of this checkout with the one binary this
// machine builds: `napi artifacts`, the license copied into each platform package, `napi prepublish`
// (its --dry-run check, then package.json's prepublishOnly, which writes the versions and
// optionalDependencies), then
// `npm pack` of the root package and of the platform package for this machine. Checks each
// tarball's files and manifest as npm would publish them. Nothing is published and the checkout
// is not changed.
//
//   node scripts/release-dry-run.js          needs ratestore.<triple>.node from `npm run build`
//   node scripts/release-dry-run.js --keep   leaves the staged copy and the tarballs in place

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

if (!existsSync(join(root, binaryName))) {
  console.error(`release-dry-run: no ${binaryName} in the checkout: run \`npm run build\` first`);
  process.exit(1);
}
const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'));
const { version } = pkg;
const targets = pkg.napi.targets;

const work = mkdtempSync(join(tmpdir(), 'ratestore-release-'));
const stage = join(work, 'stage');
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
    if (binary === binaryName) copyFileSync(join(root, binaryName), file);
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

  const pack = (cwd) => {
    const [packed] = JSON.parse(run('npm', ['pack', '--json', '--pack-destination', work], cwd));
    const tarball = join(work, packed.filename);
    const files = run('tar', ['-tzf', tarball], work).trim().split('\n').sort();
    const manifest = JSON.parse(run('tar', ['-xzOf', tarball, 'package/package.json'], work));
    return { tarball, files, manifest };
  };

  console.log(`\nroot package (ratestore@${version})`);
  const rootPack = pack(stage);
  const libFiles = tracked.filter((file) => /^lib\/[^/]+\.js$/.test(file));
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

  console.log(`\nplatform package (ratestore-${triple}@${version})`);
  const platformPack = pack(join(stage, 'npm', triple));
  const expectedPlatform = ['LICENSE', 'README.md', 'package.json', binaryName].map((f) => `package/${f}`).sort();
  check(same(platformPack.files, expectedPlatform), `files: ${show(platformPack.files)}`);
  const m = platformPack.manifest;
  check(m.name === `ratestore-${triple}` && m.version === version, `name and version: ${m.name}@${m.version}`);
  check(m.main === binaryName, `main: ${m.main}`);
  for (const field of ['repository', 'homepage', 'bugs', 'license']) {
    check(same(m[field], pkg[field]), `${field} as in the root package`);
  }
  const own = expectedFor(targets.find((target) => expectedFor(target).binary === binaryName));
  check(same(m.os, own.os), `os: ${show(m.os)}`);
  check(same(m.cpu, own.cpu), `cpu: ${show(m.cpu)}`);
  check(same(m.libc, own.libc), `libc: ${show(m.libc)}`);
  const unpacked = join(work, 'unpacked');
  mkdirSync(unpacked);
  run('tar', ['-xzf', platformPack.tarball, '-C', unpacked], work);
  const binaryVersion = run(
    process.execPath,
    ['-p', `require(${show(join(unpacked, 'package', binaryName))}).version()`],
    work,
  ).trim();
  check(binaryVersion === version, `the packed binary loads and says version ${binaryVersion}`);

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
