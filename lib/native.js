'use strict';
// Loads the prebuilt addon for this platform: a local build first (a
// checkout after `npm run build`), then the per-platform npm package. A
// binary built for another version of the package is refused.

const { basename, join } = require('node:path');
const { PUBLISHED, isMusl, platformTriple } = require('./platform.js');

const FROM_SOURCE = 'build from source with the Rust toolchain: `npm run build` in a ratestore checkout';

// A bundler that pulled this file into a chunk cannot follow the require()s below.
const bundled = basename(__filename) !== 'native.js';

function packageVersion() {
  return require('../package.json').version;
}

function noBinaryMessage(triple) {
  if (bundled) {
    return (
      `ratestore: the native binary cannot be loaded from a bundle (this code runs from ${__filename}). ` +
      "Keep ratestore out of the bundle: in Next.js, `serverExternalPackages: ['ratestore']` in next.config; " +
      'with webpack, list it in `externals`.'
    );
  }
  if (!PUBLISHED.includes(triple)) {
    return (
      `ratestore: no prebuilt binary is published for this platform (${triple}, Node.js ${process.version}), ` +
      `only for ${PUBLISHED.join(', ')}, and no local build was found. Fix: ${FROM_SOURCE}.`
    );
  }
  return (
    `ratestore: no prebuilt binary for this platform: looked for the package ratestore-${triple} ` +
    `(Node.js ${process.version}) and a local build, and found neither. ` +
    `Fix: install it with \`npm install ratestore-${triple}@${packageVersion()}\` ` +
    '(npm leaves it out when optional dependencies are omitted, or when the lockfile was made on another platform), ' +
    `or ${FROM_SOURCE}.`
  );
}

/** The version a binary says it was built from, or null when it cannot say. */
function binaryVersion(binary) {
  try {
    const version = binary && typeof binary.version === 'function' ? binary.version() : null;
    return typeof version === 'string' ? version : null;
  } catch {
    return null;
  }
}

/** The binary, when it was built for this package's version: a mismatch would misread its exports. */
function checkVersion(binary, candidate, triple) {
  const expected = packageVersion();
  const found = binaryVersion(binary);
  if (found === expected) return binary;
  const where = candidate.endsWith('.node') ? `the local build ${candidate}` : `the package ${candidate}`;
  const error = new Error(
    `ratestore: the native binary is version ${found === null ? 'unknown (it has no version())' : found}, ` +
      `but the JavaScript package is ${expected}, and the two must match (loaded ${where}). ` +
      `Fix: install the matching binary with \`npm install ratestore-${triple}@${expected}\`, ` +
      'or rebuild it: `npm run build` in a ratestore checkout.',
  );
  throw Object.assign(error, { code: 'ERR_RATESTORE_BINARY_VERSION', expected, found });
}

function load() {
  const triple = platformTriple(process.platform, process.arch, isMusl);
  const tried = [];
  for (const candidate of [join(__dirname, '..', `ratestore.${triple}.node`), `ratestore-${triple}`]) {
    let binary;
    try {
      binary = require(candidate);
    } catch (error) {
      if (error && error.code !== 'MODULE_NOT_FOUND') throw error;
      tried.push(candidate);
      continue;
    }
    return checkVersion(binary, candidate, triple);
  }
  const error = new Error(noBinaryMessage(triple));
  throw Object.assign(error, { code: 'ERR_RATESTORE_NO_BINARY', tried });
}

module.exports = load();
