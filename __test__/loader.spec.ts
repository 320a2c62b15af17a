// The loader: which binary each platform needs, how it tells musl from glibc without stalling or
// throwing, and that a binary built for another version of the package is refused.
import { execFile } from 'node:child_process';
import { cpSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseTriple } from '@napi-rs/cli';
import { afterAll, describe, expect, it } from 'vitest';

const load = createRequire(__filename);
const root = join(__dirname, '..');
const { PUBLISHED, isMusl, muslFromLdd, platformTriple } = load('../lib/platform.js') as {
  PUBLISHED: string[];
  isMusl(probe?: { readFile?: (path: string) => string | null; report?: unknown }): boolean;
  muslFromLdd(text: string): boolean;
  platformTriple(platform: string, arch: string, isMusl: () => boolean): string;
};
const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'));

// The first lines of each libc's /usr/bin/ldd.
const GLIBC_LDD = `#!/bin/bash
# Copyright (C) 1996-2022 Free Software Foundation, Inc.
# This file is part of the GNU C Library.
TEXTDOMAIN=libc
RTLDLIST="/lib64/ld-linux-x86-64.so.2 /libx32/ld-linux-x32.so.2"
`;
const MUSL_LDD = `#!/bin/sh
exec /lib/ld-musl-aarch64.so.1 --list "$@"
`;

describe('platformTriple', () => {
  // The libc each case's check answers; '-' where it must not be asked.
  const cases: [string, string, 'glibc' | 'musl' | '-', string][] = [
    ['linux', 'x64', 'glibc', 'linux-x64-gnu'],
    ['linux', 'x64', 'musl', 'linux-x64-musl'],
    ['linux', 'arm64', 'glibc', 'linux-arm64-gnu'],
    ['linux', 'arm64', 'musl', 'linux-arm64-musl'],
    ['darwin', 'x64', '-', 'darwin-x64'],
    ['darwin', 'arm64', '-', 'darwin-arm64'],
    ['win32', 'x64', '-', 'win32-x64-msvc'],
    ['win32', 'arm64', '-', 'win32-arm64-msvc'],
  ];
  const libcCheck = (libc: string) => () => {
    if (libc === '-') throw new Error('asked for the libc off Linux');
    return libc === 'musl';
  };
  it.each(cases)('%s %s (libc: %s) is %s', (platform, arch, libc, triple) => {
    expect(platformTriple(platform, arch, libcCheck(libc))).toBe(triple);
  });

  it('covers every published target, and package.json publishes each', () => {
    expect(cases.map(([, , , triple]) => triple).sort()).toEqual([...PUBLISHED].sort());
    const targets = pkg.napi.targets.map((target: string) => parseTriple(target).platformArchABI);
    expect(targets.sort()).toEqual([...PUBLISHED].sort());
  });

  it('names a platform nobody publishes for, as a local build there is named', () => {
    expect(platformTriple('freebsd', 'x64', libcCheck('-'))).toBe('freebsd-x64');
    expect(PUBLISHED).not.toContain('freebsd-x64');
  });
});

describe('isMusl', () => {
  /** A report that records what it was asked, and whether network details were left out then. */
  function fakeReport(answer: object | (() => never)) {
    const report = {
      excludeNetwork: false,
      calls: [] as boolean[],
      getReport() {
        report.calls.push(report.excludeNetwork);
        return typeof answer === 'function' ? answer() : answer;
      },
    };
    return report;
  }
  const files =
    (contents: Record<string, string>) =>
    (path: string): string | null =>
      contents[path] ?? null;

  it('reads the libc from the ldd file', () => {
    expect(muslFromLdd(GLIBC_LDD)).toBe(false);
    expect(muslFromLdd(MUSL_LDD)).toBe(true);
  });

  it('asks for no report when the ldd file answers', () => {
    const report = fakeReport({ header: { glibcVersionRuntime: '2.36' } });
    expect(isMusl({ readFile: files({ '/usr/bin/ldd': MUSL_LDD }), report })).toBe(true);
    expect(isMusl({ readFile: files({ '/usr/bin/ldd': GLIBC_LDD }), report })).toBe(false);
    expect(report.calls).toEqual([]);
  });

  it('without the ldd file, asks for a report without its network part, then restores the setting', () => {
    const glibc = fakeReport({ header: { glibcVersionRuntime: '2.36' }, sharedObjects: [] });
    expect(isMusl({ readFile: files({}), report: glibc })).toBe(false);
    expect(glibc.calls).toEqual([true]);
    expect(glibc.excludeNetwork).toBe(false);

    const musl = fakeReport({ header: {}, sharedObjects: ['/lib/ld-musl-x86_64.so.1'] });
    expect(isMusl({ readFile: files({}), report: musl })).toBe(true);
    expect(musl.calls).toEqual([true]);
  });

  it('falls back to the objects mapped into the process, and to glibc when nothing tells', () => {
    const mapsMusl = '7f0000000000-7f0000001000 r-xp 00000000 08:01 42 /lib/ld-musl-x86_64.so.1\n';
    const mapsGlibc = '7f0000000000-7f0000001000 r-xp 00000000 08:01 42 /usr/lib/x86_64-linux-gnu/libc.so.6\n';
    const silent = fakeReport({ header: {}, sharedObjects: [] });
    expect(isMusl({ readFile: files({ '/proc/self/maps': mapsMusl }), report: silent })).toBe(true);
    expect(isMusl({ readFile: files({ '/proc/self/maps': mapsGlibc }), report: silent })).toBe(false);
    expect(isMusl({ readFile: files({}), report: silent })).toBe(false);
  });

  it('never throws: no process.report, a report that throws, or one that refuses the setting', () => {
    const none = files({ '/proc/self/maps': '/lib/ld-musl-aarch64.so.1' });
    expect(isMusl({ readFile: none, report: undefined })).toBe(true);
    expect(isMusl({ readFile: files({}), report: null })).toBe(false);
    expect(isMusl({ readFile: files({}), report: {} })).toBe(false);
    const throwing = fakeReport(() => {
      throw new Error('no report here');
    });
    expect(isMusl({ readFile: files({}), report: throwing })).toBe(false);
    const frozen = Object.freeze({
      excludeNetwork: false,
      getReport: () => ({ header: { glibcVersionRuntime: '2.36' } }),
    });
    expect(isMusl({ readFile: files({}), report: frozen })).toBe(false);
  });

  it('tells this machine the same as its diagnostic report does', () => {
    if (process.platform !== 'linux') return;
    (process.report as NodeJS.ProcessReport & { excludeNetwork: boolean }).excludeNetwork = true;
    const { header } = process.report.getReport() as { header: { glibcVersionRuntime?: string } };
    expect(isMusl()).toBe(!header.glibcVersionRuntime);
  });
});

// The real lib/native.js, run in a child process so that what it changes (process.report, a copy
// of the loader with its own package.json) stays there.
interface Outcome {
  loaded?: string[];
  version?: string;
  name?: string;
  code?: string;
  message?: string;
  expected?: string;
  found?: string | null;
}

function loadIn(nativeJs: string, before = ''): Promise<Outcome> {
  const script = `
    ${before}
    let outcome;
    try {
      const binary = require(${JSON.stringify(nativeJs)});
      outcome = { loaded: Object.keys(binary).sort(), version: typeof binary.version === 'function' ? binary.version() : undefined };
    } catch (error) {
      outcome = { name: error.name, code: error.code, message: error.message, expected: error.expected, found: error.found };
    }
    console.log(JSON.stringify(outcome));`;
  return new Promise((resolve, reject) => {
    execFile(process.execPath, ['-e', script], { cwd: root }, (error, stdout, stderr) => {
      if (error) reject(new Error(`${error.message}\n${stderr}`));
      else resolve(JSON.parse(stdout));
    });
  });
}

const nativeJs = join(root, 'lib', 'native.js');
const triple = platformTriple(process.platform, process.arch, isMusl);
const work = mkdtempSync(join(tmpdir(), 'ratestore-loader-'));
afterAll(() => rmSync(work, { recursive: true, force: true }));

/**
 * A copy of the loader in a package of the given version, beside a platform package whose
 * "binary" is a JS object: what the loader does with a binary is checked without building one.
 */
function packageWithStub(name: string, version: string, binarySource: string): string {
  const dir = join(work, name);
  mkdirSync(join(dir, 'lib'), { recursive: true });
  for (const file of ['native.js', 'platform.js']) cpSync(join(root, 'lib', file), join(dir, 'lib', file));
  writeFileSync(join(dir, 'package.json'), JSON.stringify({ name: 'ratestore', version }));
  const stub = join(dir, 'node_modules', `ratestore-${triple}`);
  mkdirSync(stub, { recursive: true });
  writeFileSync(join(stub, 'package.json'), JSON.stringify({ name: `ratestore-${triple}`, version, main: 'index.js' }));
  writeFileSync(join(stub, 'index.js'), binarySource);
  return join(dir, 'lib', 'native.js');
}

describe('the loader', () => {
  it('loads the built binary, whose version is the package version', async () => {
    const outcome = await loadIn(nativeJs);
    expect(outcome.code).toBeUndefined();
    expect(outcome.version).toBe(pkg.version);
    expect(outcome.loaded).toContain('memoryStore');
  });

  it('loads without process.report, and without asking for a report when the ldd file is there', async () => {
    const missing = await loadIn(nativeJs, `Object.defineProperty(process, 'report', { value: undefined });`);
    expect(missing.version).toBe(pkg.version);
    // A report asked for here ends the child with an error.
    const trap = `Object.defineProperty(process, 'report', { value: { getReport() { process.exit(3); } } });`;
    const trapped = await loadIn(nativeJs, trap);
    expect(trapped.version).toBe(pkg.version);
  });

  it('loads with neither the ldd file nor process.report', async () => {
    const noLdd = `
      const fs = require('node:fs');
      const readFileSync = fs.readFileSync;
      fs.readFileSync = (path, ...rest) => {
        if (path === '/usr/bin/ldd') throw Object.assign(new Error('ENOENT'), { code: 'ENOENT' });
        return readFileSync(path, ...rest);
      };
      Object.defineProperty(process, 'report', { value: undefined });`;
    expect((await loadIn(nativeJs, noLdd)).version).toBe(pkg.version);
  });

  it('accepts a platform package of the same version', async () => {
    const stub = packageWithStub('same', '1.2.3', `module.exports = { version: () => '1.2.3', memoryStore() {} };`);
    expect(await loadIn(stub)).toEqual({ loaded: ['memoryStore', 'version'], version: '1.2.3' });
  });

  it('refuses a platform package of another version, naming both and the fix', async () => {
    const stub = packageWithStub('other', '1.2.3', `module.exports = { version: () => '1.2.2' };`);
    const outcome = await loadIn(stub);
    expect(outcome).toMatchObject({
      name: 'Error',
      code: 'ERR_RATESTORE_BINARY_VERSION',
      expected: '1.2.3',
      found: '1.2.2',
    });
    expect(outcome.message).toContain('version 1.2.2');
    expect(outcome.message).toContain('JavaScript package is 1.2.3');
    expect(outcome.message).toContain(`the package ratestore-${triple}`);
    expect(outcome.message).toContain(`npm install ratestore-${triple}@1.2.3`);
    expect(outcome.message).toContain('npm run build');
  });

  it('refuses a binary that cannot say its version', async () => {
    const sources = [
      `module.exports = { memoryStore() {} };`,
      `module.exports = { version: 'not a function' };`,
      `module.exports = { version() { throw new Error('no'); } };`,
      `module.exports = { version: () => 123 };`,
    ];
    for (const [index, source] of sources.entries()) {
      const outcome = await loadIn(packageWithStub(`unversioned-${index}`, '1.2.3', source));
      expect(outcome).toMatchObject({ name: 'Error', code: 'ERR_RATESTORE_BINARY_VERSION', found: null });
      expect(outcome.message).toContain('version unknown');
    }
  });

  it('refuses a local build of another version', async () => {
    const stub = packageWithStub('local', '9.9.9', `module.exports = { version: () => '9.9.9' };`);
    const binary = `ratestore.${triple}.node`;
    cpSync(join(root, binary), join(work, 'local', binary));
    const outcome = await loadIn(stub);
    expect(outcome).toMatchObject({ code: 'ERR_RATESTORE_BINARY_VERSION', expected: '9.9.9', found: pkg.version });
    // The path as the loader sees it may differ in form (macOS's /private/var, Windows' short names).
    expect(outcome.message).toMatch(new RegExp(`the local build \\S+local\\W${binary.replaceAll('.', '\\.')}`));
  });

  it('without a binary, names the package to install', async () => {
    // Another CPU: no local build and no package for it here.
    const arch = process.arch === 'arm64' ? 'x64' : 'arm64';
    const outcome = await loadIn(nativeJs, `Object.defineProperty(process, 'arch', { value: '${arch}' });`);
    const wanted = triple.replace(process.arch, arch);
    expect(outcome).toMatchObject({ name: 'Error', code: 'ERR_RATESTORE_NO_BINARY' });
    expect(outcome.message).toContain(`looked for the package ratestore-${wanted}`);
    expect(outcome.message).toContain(`npm install ratestore-${wanted}@${pkg.version}`);
  });

  it('on a platform nobody publishes for, says so and how to build from source', async () => {
    const outcome = await loadIn(nativeJs, `Object.defineProperty(process, 'platform', { value: 'freebsd' });`);
    expect(outcome).toMatchObject({ name: 'Error', code: 'ERR_RATESTORE_NO_BINARY' });
    expect(outcome.message).toContain(`no prebuilt binary is published for this platform (freebsd-${process.arch}`);
    expect(outcome.message).toContain('linux-x64-gnu, linux-x64-musl');
    expect(outcome.message).toContain('npm run build');
  });
});
