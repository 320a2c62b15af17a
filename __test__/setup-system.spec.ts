// The set-up step `npm test` runs first (scripts/setup-system.js): with a program the suites start
// missing from PATH and no way to install it, it stops before any test with one message that names what
// is missing and the command that installs it.
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, realpathSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { delimiter, dirname, join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { REQUIREMENTS } from '../scripts/setup-system.js';

const root = join(__dirname, '..');
const script = join(root, 'scripts', 'setup-system.js');

/** Where `name` is on this process's PATH. */
function which(name: string): string | undefined {
  return (process.env.PATH ?? '')
    .split(delimiter)
    .map((dir) => join(dir, name))
    .find((path) => existsSync(path));
}

const dirs: string[] = [];
afterAll(() => {
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

/**
 * A directory to be the whole PATH: node, `id`, `sh` (npm's script shell), and every program of the table that this machine has,
 * but not `left out`, and neither apt-get nor sudo (so nothing can be installed).
 */
function pathWithout(leftOut: string): string {
  const dir = mkdtempSync(join(tmpdir(), 'ratestore-setup-'));
  dirs.push(dir);
  symlinkSync(process.execPath, join(dir, 'node'));
  const programs = new Set(['id', 'sh', ...REQUIREMENTS.flatMap((r) => (r.program ? [r.program] : []))]);
  for (const name of programs) {
    const found = name === leftOut ? undefined : which(name);
    if (found) symlinkSync(found, join(dir, name));
  }
  return dir;
}

const installLine = (packages: string) =>
  new RegExp(`^  (sudo )?apt-get update && (sudo )?apt-get install -y (\\S+ )*${packages}( \\S+)*$`, 'm');

describe('scripts/setup-system.js', () => {
  it('exits 1 with a program missing from PATH and no apt-get or sudo, naming it and its install command', () => {
    expect(REQUIREMENTS.find((r) => r.program === 'redis-server')?.package).toBe('redis-server');
    const run = spawnSync(process.execPath, [script, 'test'], {
      env: { ...process.env, PATH: pathWithout('redis-server') },
      encoding: 'utf8',
      timeout: 20_000,
    });
    expect(run.status).toBe(1);
    expect(run.stderr).toMatch(/^ratestore: npm test cannot run: .*\(nothing was run\)\.$/m);
    expect(run.stderr).toMatch(/^Missing:$/m);
    expect(run.stderr).toMatch(/^ {2}redis-server +\(Debian package redis-server: /m);
    expect(run.stderr).toMatch(/^Not installed here: apt-get was not found on PATH/m);
    expect(run.stderr).toMatch(installLine('redis-server'));
    // One message: the install command comes once, after the list.
    expect(run.stderr.match(/apt-get install/g)).toHaveLength(1);
  });

  it('stops `npm test` before it builds or runs anything, when installing is forbidden', () => {
    const bin = pathWithout('openssl');
    // A cargo that leaves a mark: the build and `cargo test` come after the set-up step.
    const mark = join(bin, 'cargo-ran');
    writeFileSync(join(bin, 'cargo'), `#!/bin/sh\necho ran > '${mark}'\nexit 1\n`, { mode: 0o755 });
    const npm = which('npm');
    expect(npm, 'npm on PATH').toBeDefined();
    // npm's own script, run by this Node.js (the PATH below has no npm).
    const npmCli = join(dirname(realpathSync(npm!)), 'npm-cli.js');
    const run = spawnSync(process.execPath, [npmCli, 'test'], {
      cwd: root,
      env: { ...process.env, PATH: bin, RATESTORE_NO_INSTALL: '1' },
      encoding: 'utf8',
      timeout: 60_000,
    });
    const output = run.stdout + run.stderr;
    expect(run.status, output).not.toBe(0);
    expect(output).toMatch(/^ {2}openssl +\(Debian package openssl: /m);
    expect(output).toMatch(/^Not installed here: RATESTORE_NO_INSTALL=1 forbids installing\.$/m);
    expect(output).toMatch(installLine('openssl'));
    expect(existsSync(mark)).toBe(false);
    // Neither the build, nor cargo, nor Vitest started.
    expect(output).not.toMatch(/building the native addon|> ratestore@\S+ test:unit| RUN {2}v/);
  });
});
