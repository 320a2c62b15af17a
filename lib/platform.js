'use strict';
// Which prebuilt binary this process needs: its name suffix (`ratestore.<triple>.node`,
// `ratestore-<triple>` on npm), as napi-rs names them. Pure functions of what they are given,
// so every platform can be checked from any one.

const { readFileSync } = require('node:fs');

/** The triples a binary is published for: package.json's `napi.targets`, as napi-rs names them. */
const PUBLISHED = [
  'linux-x64-gnu',
  'linux-x64-musl',
  'linux-arm64-gnu',
  'linux-arm64-musl',
  'darwin-x64',
  'darwin-arm64',
  'win32-x64-msvc',
  'win32-arm64-msvc',
];

/**
 * The triple for a platform and CPU (`process.platform`, `process.arch`). `isMusl` is asked only
 * on Linux. A triple outside PUBLISHED is still answered: a local build is named by it.
 */
function platformTriple(platform, arch, isMusl) {
  if (platform === 'linux') return `linux-${arch}-${isMusl() ? 'musl' : 'gnu'}`;
  if (platform === 'win32') return `win32-${arch}-msvc`;
  return `${platform}-${arch}`;
}

/** What the text of `/usr/bin/ldd` says: musl's is a script that runs `ld-musl-*.so.1`. */
function muslFromLdd(text) {
  return text.includes('musl');
}

const isMuslFile = (file) => file.includes('libc.musl-') || file.includes('ld-musl-');

/**
 * What a diagnostic report says, or null when there is none. Network details stay out of it:
 * collecting them does reverse DNS for every interface, which has stalled start-up for minutes.
 */
function muslFromReport(report) {
  if (!report || typeof report.getReport !== 'function') return null;
  const excludeNetwork = report.excludeNetwork;
  try {
    report.excludeNetwork = true;
    const { header, sharedObjects } = report.getReport();
    if (header && header.glibcVersionRuntime) return false;
    if (Array.isArray(sharedObjects) && sharedObjects.some(isMuslFile)) return true;
    return null;
  } catch {
    return null;
  } finally {
    try {
      report.excludeNetwork = excludeNetwork;
    } catch {
      // A report object that refuses the setting has nothing to restore.
    }
  }
}

/** Reads a file as text, or answers null. */
function readText(path) {
  try {
    return readFileSync(path, 'utf8');
  } catch {
    return null;
  }
}

/**
 * Whether this Linux process runs on musl libc (Alpine) rather than glibc. The cheapest sign first:
 * the `ldd` file, then `process.report` (without its network part), then the objects mapped into
 * this process, which name musl's dynamic loader. No child process; glibc when nothing tells.
 */
function isMusl({ readFile, report } = { readFile: readText, report: process.report }) {
  const ldd = readFile('/usr/bin/ldd');
  if (ldd !== null) return muslFromLdd(ldd);
  const fromReport = muslFromReport(report);
  if (fromReport !== null) return fromReport;
  const maps = readFile('/proc/self/maps');
  return maps !== null && isMuslFile(maps);
}

module.exports = { PUBLISHED, platformTriple, isMusl, muslFromLdd };
