// What the SQL stores' suites share about the environment: a scope of variables set for one test, and
// the cases of a store that reads its URL from DATABASE_URL or its own variable on its first call.
import { randomUUID } from 'node:crypto';
import { expect, it } from 'vitest';

/** `withEnv(vars, fn)`: runs `fn` with `names` unset but for `vars`, then puts them back as they were. */
export function envScope(names: string[]) {
  return async function withEnv<T>(vars: Record<string, string>, fn: () => Promise<T>): Promise<T> {
    const saved = names.map((name) => process.env[name]);
    for (const name of names) delete process.env[name];
    Object.assign(process.env, vars);
    try {
      return await fn();
    } finally {
      names.forEach((name, i) => (saved[i] === undefined ? delete process.env[name] : (process.env[name] = saved[i])));
    }
  };
}

interface UrlStore {
  shared: boolean;
  hit(key: string, windowMs: number, amount: number): Promise<{ count: number }>;
  ping(): Promise<void>;
  close(): Promise<void>;
}

/**
 * The cases of a store made with no URL (`create()`), which reads DATABASE_URL, else `variable`, on
 * its first call: `url()` is a server's, `badUrl` one that reaches none; `rejection` checks an error
 * shows no secret; `key` is a key marker.
 */
export function urlFromEnvCases({
  create,
  variable,
  url,
  badUrl,
  withEnv,
  rejection,
  key,
}: {
  create: () => UrlStore;
  variable: string;
  url: () => string;
  badUrl: string;
  withEnv: ReturnType<typeof envScope>;
  rejection: (pending: Promise<unknown>) => Promise<Error & { code?: string }>;
  key: string;
}): void {
  it('is shared, and constructing it reads no environment and does no I/O', async () => {
    await withEnv({}, async () => {
      const store = create();
      expect(store.shared).toBe(true);
      // The URL is read on the first call: set after construction, it is used.
      process.env[variable] = url();
      expect((await store.hit(`lazy:${randomUUID()}`, 60_000, 2)).count).toBe(2);
      await store.close();
    });
  });

  it(`prefers DATABASE_URL over ${variable}`, async () => {
    await withEnv({ DATABASE_URL: url(), [variable]: badUrl }, async () => {
      const store = create();
      await store.ping();
      await store.close();
    });
  });

  it('rejects with ERR_CONFIG naming the variables when no URL is set', async () => {
    await withEnv({}, async () => {
      const error = await rejection(create().hit(key, 60_000, 1));
      expect(error.code).toBe('ERR_CONFIG');
      expect(error.message).toContain('DATABASE_URL');
      expect(error.message).toContain(variable);
    });
  });
}
