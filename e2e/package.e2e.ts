// The published shape: the two tarballs `npm pack` makes install and work where there is no Rust
// toolchain, their types compile under --strict, and without a binary the loader says what to do.
import { cpSync, existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { delimiter, join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  cleanEnv,
  exec,
  fixtures,
  npmInstall,
  packTarballs,
  removeDir,
  root,
  run,
  tempDir,
  type Tarballs,
} from './support.js';

const work = tempDir('package');
let tarballs: Tarballs;

/** An empty project that installs the given tarballs. */
async function consumer(name: string, specs: string[], env?: NodeJS.ProcessEnv): Promise<string> {
  const dir = join(work, name);
  mkdirSync(dir);
  writeFileSync(join(dir, 'package.json'), JSON.stringify({ name: name, private: true }));
  await npmInstall(dir, specs, env);
  return dir;
}

beforeAll(async () => {
  tarballs = await packTarballs(work);
}, 180_000);

afterAll(() => removeDir(work));

async function tarList(tarball: string): Promise<string[]> {
  return (await run('tar', ['-tzf', tarball], { cwd: work })).trim().split('\n').sort();
}

describe('npm pack', () => {
  it('puts the binary in the platform package only', async () => {
    const rootFiles = await tarList(tarballs.root);
    expect(rootFiles).toContain('package/index.js');
    expect(rootFiles).toContain('package/index.d.ts');
    expect(rootFiles.filter((file) => file.endsWith('.node'))).toEqual([]);
    expect(await tarList(tarballs.platform)).toEqual([
      'package/README.md',
      'package/package.json',
      `package/ratestore.${tarballs.triple}.node`,
    ]);
  });
});

describe('installed from the tarballs, with no Rust toolchain on PATH', () => {
  // PATH without the directories that hold cargo or rustc.
  const path = (process.env.PATH ?? '')
    .split(delimiter)
    .filter((dir) => !['cargo', 'rustc'].some((tool) => existsSync(join(dir, tool))))
    .join(delimiter);
  const env = cleanEnv({ PATH: path });
  delete env.CARGO_HOME;
  delete env.RUSTUP_HOME;
  let dir: string;

  beforeAll(async () => {
    const which = await exec('sh', ['-c', 'command -v cargo || command -v rustc'], { cwd: work, env });
    expect(which.code, `a Rust tool is still on PATH: ${which.stdout}`).not.toBe(0);
    dir = await consumer('no-rust', [tarballs.root, tarballs.platform], env);
  }, 180_000);

  it('loads the binary from the platform package', async () => {
    const resolved = await run('node', ['-p', `require.resolve('ratestore-${tarballs.triple}')`], { cwd: dir, env });
    expect(resolved.trim()).toBe(
      join(dir, 'node_modules', `ratestore-${tarballs.triple}`, `ratestore.${tarballs.triple}.node`),
    );
  });

  it('works through require()', async () => {
    const script = `
      const { memoryStore } = require('ratestore');
      const store = memoryStore();
      (async () => {
        const first = await store.hit('k', 60000, 1);
        const second = await store.hit('k', 60000, 2);
        console.log(JSON.stringify([first.count, second.count, store.shared]));
      })();`;
    expect(JSON.parse(await run('node', ['-e', script], { cwd: dir, env }))).toEqual([1, 3, false]);
  });

  it('works through import', async () => {
    const script = `
      import { createLimiter, memoryStore } from 'ratestore';
      const limiter = createLimiter({ store: memoryStore(), limit: 1, windowMs: 60000 });
      const answers = [await limiter.check('k'), await limiter.check('k')];
      console.log(JSON.stringify(answers.map((answer) => answer.allowed)));`;
    const output = await run('node', ['--input-type=module', '-e', script], { cwd: dir, env });
    expect(JSON.parse(output)).toEqual([true, false]);
  });

  it('has types that compile with tsc --strict', async () => {
    cpSync(join(fixtures, 'typing.ts'), join(dir, 'typing.ts'));
    const tsc = join(root, 'node_modules', '.bin', 'tsc');
    const args = ['--strict', '--noEmit', '--module', 'nodenext', '--target', 'es2022', '--types', '', 'typing.ts'];
    const output = await exec(tsc, args, { cwd: dir, env });
    expect(output.code, output.stdout + output.stderr).toBe(0);
  });
});

describe('the loader without a binary', () => {
  it('names the platform package it looked for and how to install it', async () => {
    const dir = await consumer('no-binary', [tarballs.root]);
    const script = `
      try {
        require('ratestore');
      } catch (error) {
        console.log(JSON.stringify({ name: error.name, code: error.code, message: error.message }));
      }`;
    const error = JSON.parse(await run('node', ['-e', script], { cwd: dir }));
    const { version } = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'));
    expect(error.name).toBe('Error');
    expect(error.code).toBe('ERR_RATESTORE_NO_BINARY');
    expect(error.message).toContain(`looked for the package ratestore-${tarballs.triple}`);
    expect(error.message).toContain(`npm install ratestore-${tarballs.triple}@${version}`);
  });

  it('says to keep ratestore out of the bundle when a bundler copied it', async () => {
    // What a bundle looks like to the loader: its code in a chunk far from node_modules/ratestore.
    const dir = join(work, 'bundle');
    cpSync(join(root, 'lib', 'native.js'), join(dir, 'chunks', 'route.js'));
    cpSync(join(root, 'lib', 'platform.js'), join(dir, 'chunks', 'platform.js'));
    const script = `
      try {
        require('./chunks/route.js');
      } catch (error) {
        console.log(JSON.stringify({ code: error.code, message: error.message }));
      }`;
    const error = JSON.parse(await run('node', ['-e', script], { cwd: dir }));
    expect(error.code).toBe('ERR_RATESTORE_NO_BINARY');
    expect(error.message).toContain("serverExternalPackages: ['ratestore']");
  });
});
