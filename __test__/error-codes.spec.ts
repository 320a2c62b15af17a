// One list of error codes: every `code` the native layer or the JS face can give is in lib/check.js's
// ERROR_CODES (which isRatestoreError reads) and in index.d.ts's RatestoreErrorCode, and nothing else is.
import { readdirSync, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { isRatestoreError, mysqlStore } from '../index.js';

const root = join(__dirname, '..');
const requireCjs = createRequire(__filename);
const { ERROR_CODES } = requireCjs('../lib/check.js') as { ERROR_CODES: Set<string> };

/** Every file under `dir` whose name ends with `ext`. */
function files(dir: string, ext: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((entry) =>
    entry.isDirectory() ? files(join(dir, entry.name), ext) : entry.name.endsWith(ext) ? [join(dir, entry.name)] : [],
  );
}

const codesIn = (text: string) => new Set([...text.matchAll(/['"`](ERR_[A-Z_]+)['"`]/g)].map((m) => m[1]));

describe('error codes', () => {
  it('index.d.ts lists exactly the codes of lib/check.js', () => {
    const dts = readFileSync(join(root, 'index.d.ts'), 'utf8');
    const union = /export type RatestoreErrorCode =([^;]+);/.exec(dts)![1];
    expect([...codesIn(union)].sort()).toEqual([...ERROR_CODES].sort());
  });

  it('every code the Rust core or lib/ gives is in the list', () => {
    const given = new Set<string>();
    for (const file of [...files(join(root, 'src'), '.rs'), ...files(join(root, 'lib'), '.js')]) {
      for (const code of codesIn(readFileSync(file, 'utf8'))) given.add(code);
    }
    // The loader's own, thrown by require('ratestore') when no binary fits (README, "Platforms"), before any store.
    for (const loader of ['ERR_RATESTORE_NO_BINARY', 'ERR_RATESTORE_BINARY_VERSION']) given.delete(loader);
    const missing = [...given].filter((code) => !ERROR_CODES.has(code));
    expect(missing).toEqual([]);
  });

  it("isRatestoreError knows every store's errors, mysqlStore's included", async () => {
    // A refused connection on a loopback port nothing listens on, answered at once.
    const store = mysqlStore({ url: 'mysql://u:secret-pw@127.0.0.1:9/db', timeoutMs: 2_000 });
    const error = await store.hit('k', 1_000, 1).then(
      () => undefined,
      (e: unknown) => e,
    );
    await store.close();
    expect(error).toBeInstanceOf(Error);
    expect(isRatestoreError(error)).toBe(true);
  });
});
