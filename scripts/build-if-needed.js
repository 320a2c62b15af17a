'use strict';
// Installs the dev dependencies when they are missing and builds the native
// addon when it is missing or older than the Rust sources, so `npm test`,
// `npm run demo` and `npm run bench` work on a fresh clone as they are.

const { execSync, spawn } = require('node:child_process');
const { existsSync, readdirSync, statSync } = require('node:fs');
const { join } = require('node:path');

const root = join(__dirname, '..');

if (!existsSync(join(root, 'node_modules', '.bin', 'napi'))) {
  console.error('ratestore: installing the dev dependencies (npm ci)...');
  execSync('npm ci --no-audit --no-fund', { cwd: root, stdio: 'inherit' });
}

function newest(path) {
  const stat = statSync(path);
  if (!stat.isDirectory()) return stat.mtimeMs;
  return Math.max(0, ...readdirSync(path).map((name) => newest(join(path, name))));
}

const binaries = readdirSync(root).filter((name) => /^ratestore\..+\.node$/.test(name));
const built = binaries.length ? Math.min(...binaries.map((name) => statSync(join(root, name)).mtimeMs)) : 0;
const sources = Math.max(
  ...['src', 'Cargo.toml', 'Cargo.lock', 'build.rs']
    .filter((p) => existsSync(join(root, p)))
    .map((p) => newest(join(root, p))),
);

if (built < sources) {
  // better-sqlite3, the benchmark's SQLite peer, is a dev dependency whose own install step is denied
  // (it would download): built here beside the addon where it is not built yet (`sqlite.js --build`
  // does nothing then), on the core the addon's build leaves idle in its last minute (the whole addon as
  // one LTO unit), so that the benchmark's smoke run in `npm test` finds it built. This process ends
  // once both have. Its output is not shown, and a failed peer build (a machine without make or g++,
  // which `npm run demo` does not need) is not the addon's: the smoke run builds it again, and says why.
  spawn(process.execPath, [join(root, 'benchmark', 'sqlite.js'), '--build'], { cwd: root, stdio: 'ignore' });
  console.error('ratestore: building the native addon (release)...');
  execSync('npm run build', { cwd: root, stdio: 'inherit' });
}
