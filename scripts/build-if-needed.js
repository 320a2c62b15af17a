'use strict';
// Installs the dev dependencies when they are missing and builds the native
// addon when it is missing or older than the Rust sources, so `npm test`,
// `npm run demo` and `npm run bench` work on a fresh clone as they are.

const { execSync } = require('node:child_process');
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
  console.error('ratestore: building the native addon (release)...');
  execSync('npm run build', { cwd: root, stdio: 'inherit' });
}
