'use strict';
// The four Linux platforms the release publishes a binary for, and how this x64 glibc machine runs a
// program on each (scripts/test-linux.js, scripts/release-dry-run.js --linux):
//
// - linux-x64-gnu: Node.js 24 (runtimes/), as it is;
// - linux-arm64-gnu: Node.js 24 for arm64 (runtimes/linux/) under qemu-user, with Debian's arm64 glibc
//   (/usr/aarch64-linux-gnu) as its root;
// - linux-x64-musl: Bun's x64 musl build, in a private mount namespace whose /usr/bin/ldd is musl's, as
//   on Alpine (ratestore's loader reads that file to tell musl from glibc), with the libstdc++.so.6
//   that test-linux.js builds on LD_LIBRARY_PATH;
// - linux-arm64-musl: Bun's arm64 musl build under qemu-user, in a root that holds Debian's arm64 musl,
//   that libstdc++.so.6 and musl's ldd, and nothing of glibc.

const { join } = require('node:path');
const { installed } = require('../runtimes.js');

const ROOT = join(__dirname, '..', '..');
const OUT = join(ROOT, 'target', 'linux');
const RUNTIMES = join(ROOT, 'runtimes', 'linux');
const QEMU = '/usr/bin/qemu-aarch64-static';
const ARM64_GLIBC = '/usr/aarch64-linux-gnu';
const MUSL_X64_ROOT = join(OUT, 'musl-x64');
const MUSL_ARM64_ROOT = join(OUT, 'musl-arm64');

const TARGETS = [
  { triple: 'linux-x64-gnu', rust: 'x86_64-unknown-linux-gnu', cpu: 'x64', libc: 'glibc' },
  { triple: 'linux-arm64-gnu', rust: 'aarch64-unknown-linux-gnu', cpu: 'arm64', libc: 'glibc' },
  { triple: 'linux-x64-musl', rust: 'x86_64-unknown-linux-musl', cpu: 'x64', libc: 'musl' },
  { triple: 'linux-arm64-musl', rust: 'aarch64-unknown-linux-musl', cpu: 'arm64', libc: 'musl' },
];

function runtimePaths() {
  const modules = join(RUNTIMES, 'node_modules');
  return {
    nodeArm64: join(modules, 'node24-arm64', 'bin', 'node'),
    bunX64Musl: join(modules, '@oven', 'bun-linux-x64-musl', 'bin', 'bun'),
    bunArm64Musl: join(modules, '@oven', 'bun-linux-aarch64-musl', 'bin', 'bun'),
  };
}

/**
 * How to run a script on `triple`'s platform: `runtime` ({ name, path, args }), `prefix` (the command
 * and arguments before the runtime's path), `childPrefix` (the same for a child process the script
 * starts with process.execPath), `env` (added to the environment).
 */
function launcher(triple) {
  const paths = runtimePaths();
  const unshare =
    process.getuid() === 0
      ? ['unshare', '--mount', '--propagation', 'private']
      : ['unshare', '--user', '--map-root-user', '--mount', '--propagation', 'private'];
  switch (triple) {
    case 'linux-x64-gnu':
      return { runtime: { ...installed('node24'), name: 'Node.js 24' }, prefix: [], childPrefix: [], env: {} };
    case 'linux-arm64-gnu': {
      const prefix = [QEMU, '-L', ARM64_GLIBC];
      const runtime = { name: 'Node.js 24 for arm64 (qemu-user, glibc)', path: paths.nodeArm64, args: [] };
      return { runtime, prefix, childPrefix: prefix, env: {} };
    }
    case 'linux-x64-musl':
      return {
        runtime: { name: "Bun's x64 musl build", path: paths.bunX64Musl, args: [] },
        prefix: [
          ...unshare,
          'sh',
          '-c',
          'mount --bind "$0" /usr/bin/ldd && exec "$@"',
          join(MUSL_X64_ROOT, 'usr', 'bin', 'ldd'),
        ],
        // A child process is in the namespace already.
        childPrefix: [],
        env: { LD_LIBRARY_PATH: join(MUSL_X64_ROOT, 'lib') },
      };
    case 'linux-arm64-musl': {
      const prefix = [QEMU, '-L', MUSL_ARM64_ROOT];
      const runtime = { name: "Bun's arm64 musl build (qemu-user, musl)", path: paths.bunArm64Musl, args: [] };
      return { runtime, prefix, childPrefix: prefix, env: {} };
    }
    default:
      throw new Error(`no Linux platform ${triple}`);
  }
}

module.exports = { ROOT, OUT, RUNTIMES, TARGETS, MUSL_X64_ROOT, MUSL_ARM64_ROOT, runtimePaths, launcher };
