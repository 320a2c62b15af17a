'use strict';
// Loads the prebuilt addon for this platform: a local build first (a
// checkout after `npm run build`), then the per-platform npm package.

const { basename, join } = require('node:path');

function platformTriple() {
  const { platform, arch } = process;
  if (platform === 'linux') {
    const { glibcVersionRuntime } = process.report.getReport().header;
    return `linux-${arch}-${glibcVersionRuntime ? 'gnu' : 'musl'}`;
  }
  if (platform === 'win32') return `win32-${arch}-msvc`;
  return `${platform}-${arch}`;
}

function noBinaryMessage(triple) {
  // A bundler that pulled this file into a chunk cannot follow the require() below.
  if (basename(__filename) !== 'native.js') {
    return (
      `ratestore: the native binary cannot be loaded from a bundle (this code runs from ${__filename}). ` +
      "Keep ratestore out of the bundle: in Next.js, `serverExternalPackages: ['ratestore']` in next.config; " +
      'with webpack, list it in `externals`.'
    );
  }
  const { version } = require('../package.json');
  return (
    `ratestore: no prebuilt binary for this platform: looked for the package ratestore-${triple} ` +
    `(Node.js ${process.version}) and a local build, and found neither. ` +
    `Fix: install it with \`npm install ratestore-${triple}@${version}\` ` +
    '(npm leaves it out when optional dependencies are omitted, or when the lockfile was made on another platform), ' +
    'or build from source with the Rust toolchain: `npm run build` in a ratestore checkout.'
  );
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
  const error = new Error(noBinaryMessage(triple));
  error.code = 'ERR_RATESTORE_NO_BINARY';
  error.tried = tried;
  throw error;
}

module.exports = load();
