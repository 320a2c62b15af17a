'use strict';
// Loads the prebuilt addon for this platform: a local build first (a
// checkout after `npm run build`), then the per-platform npm package.

const { join } = require('node:path');

function platformTriple() {
  const { platform, arch } = process;
  if (platform === 'linux') {
    const { glibcVersionRuntime } = process.report.getReport().header;
    return `linux-${arch}-${glibcVersionRuntime ? 'gnu' : 'musl'}`;
  }
  if (platform === 'win32') return `win32-${arch}-msvc`;
  return `${platform}-${arch}`;
}

function load() {
  const triple = platformTriple();
  const tried = [];
  for (const candidate of [join(__dirname, '..', `ratestore.${triple}.node`), `ratestore-${triple}`]) {
    try {
      return require(candidate);
    } catch (error) {
      if (error && error.code !== 'MODULE_NOT_FOUND') throw error;
      tried.push(candidate);
    }
  }
  const error = new Error(
    `ratestore: no prebuilt binary for this platform (${triple}, Node.js ${process.version}). ` +
      `Looked for the package ratestore-${triple} and a local build. ` +
      'Reinstall with optional dependencies enabled (`npm install ratestore`, without --no-optional or --omit=optional), ' +
      'or build from source with the Rust toolchain: `npm run build` in the ratestore checkout.',
  );
  error.code = 'ERR_RATESTORE_NO_BINARY';
  error.tried = tried;
  throw error;
}

module.exports = load();
