import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { postgresStore, type PostgresStoreOptions } from '../index.js';
import { rateLimitStoreContract } from './contract.js';
import { PASSWORD, plainPostgres, startPostgres, type PostgresServer } from './support/postgres.js';

let server: Awaited<ReturnType<typeof plainPostgres>>;
beforeAll(async () => {
  server = await plainPostgres();
}, 120_000);
afterAll(() => server?.stop());

const make = (options: PostgresStoreOptions = {}) => postgresStore({ url: server.url, timeoutMs: 5_000, ...options });

rateLimitStoreContract('postgresStore', () => make());

const KEY_MARKER = '203.0.113.77-pg-key-marker';

/** The error `pending` rejects with; it must name no key, password or URL. */
async function rejection(pending: Promise<unknown>): Promise<Error & { code?: string }> {
  const error = await pending.then(
    () => {
      throw new Error('expected a rejection');
    },
    (e: unknown) => e as Error & { code?: string },
  );
  for (const secret of [KEY_MARKER, PASSWORD, 'postgres://']) expect(String(error.message)).not.toContain(secret);
  return error;
}

async function withEnv<T>(vars: Record<string, string>, fn: () => Promise<T>): Promise<T> {
  const names = ['DATABASE_URL', 'POSTGRES_URL'];
  const saved = names.map((name) => process.env[name]);
  for (const name of names) delete process.env[name];
  Object.assign(process.env, vars);
  try {
    return await fn();
  } finally {
    names.forEach((name, i) => (saved[i] === undefined ? delete process.env[name] : (process.env[name] = saved[i])));
  }
}

describe('postgresStore', () => {
  let own: PostgresServer;
  beforeAll(async () => {
    own = await startPostgres();
  }, 120_000);
  afterAll(() => own?.stop());
  const ownStore = (options: PostgresStoreOptions = {}) =>
    postgresStore({ url: own.url, timeoutMs: 3_000, ...options });

  it('is shared, and constructing it reads no environment and does no I/O', async () => {
    await withEnv({}, async () => {
      const store = postgresStore();
      expect(store.shared).toBe(true);
      // The URL is read on the first call: set after construction, it is used.
      process.env.POSTGRES_URL = own.url;
      expect((await store.hit(`lazy:${randomUUID()}`, 60_000, 2)).count).toBe(2);
      await store.close();
    });
  });

  it('prefers DATABASE_URL over POSTGRES_URL', async () => {
    await withEnv({ DATABASE_URL: own.url, POSTGRES_URL: 'postgres://nobody@127.0.0.1:1/none' }, async () => {
      const store = postgresStore();
      await store.ping();
      await store.close();
    });
  });

  it('rejects with ERR_CONFIG naming the variables when no URL is set', async () => {
    await withEnv({}, async () => {
      const error = await rejection(postgresStore().hit(KEY_MARKER, 60_000, 1));
      expect(error.code).toBe('ERR_CONFIG');
      expect(error.message).toContain('DATABASE_URL');
      expect(error.message).toContain('POSTGRES_URL');
    });
  });

  it('rejects a wrong password with ERR_AUTH, naming neither password nor URL', async () => {
    const url = own.url.replace(PASSWORD, 'wrong-secret-7d1f');
    const error = await rejection(postgresStore({ url }).hit(KEY_MARKER, 60_000, 1));
    expect(error.code).toBe('ERR_AUTH');
    expect(error.message).not.toContain('wrong-secret-7d1f');
  });

  it('rejects sslmode=require with ERR_CONFIG (TLS is not supported yet)', async () => {
    const error = await rejection(ownStore({ url: `${own.url}?sslmode=require` }).hit(KEY_MARKER, 60_000, 1));
    expect(error.code).toBe('ERR_CONFIG');
  });

  it('refuses bad options with a TypeError or RangeError', () => {
    expect(() => postgresStore({ url: 1 as unknown as string })).toThrow(TypeError);
    expect(() => postgresStore({ timeoutMs: 0 })).toThrow(RangeError);
    expect(() => postgresStore({ nope: 1 } as unknown as PostgresStoreOptions)).toThrow(TypeError);
  });

  it('with createTable false, a missing table rejects with ERR_POSTGRES (42P01) and nothing is created', async () => {
    const table = `missing_${randomUUID().replace(/-/g, '')}`;
    const error = await rejection(ownStore({ table, createTable: false }).hit(KEY_MARKER, 60_000, 1));
    expect(error.code).toBe('ERR_POSTGRES');
    expect(error.message).toContain('42P01');
    expect(await own.sql(`SELECT count(*) FROM pg_tables WHERE tablename = '${table}'`)).toBe('0');
  });

  it('creates its table on first use, once, when many stores start at once', async () => {
    const table = `race_${randomUUID().replace(/-/g, '')}`;
    const stores = Array.from({ length: 8 }, () => ownStore({ table }));
    const hits = await Promise.all(stores.map((store) => store.hit('k', 60_000, 1)));
    expect(hits.map((h) => h.count).sort((a, b) => a - b)).toEqual([1, 2, 3, 4, 5, 6, 7, 8]);
    expect(await own.sql(`SELECT total FROM ${table} WHERE key = 'k'`)).toBe('8');
    await Promise.all(stores.map((store) => store.close()));
  });

  it("continues the seed's own SQL count, and the seed's SQL continues the store's", async () => {
    const store = ownStore();
    await store.ping(); // creates askdare_counters
    const key = `seed:${randomUUID()}`;
    // Seed 000's upsert, verbatim in shape.
    const seedHit = (amount: number) =>
      own.sql(`INSERT INTO askdare_counters AS c (key, total, reset_at)
        VALUES ('${key}', ${amount}, now() + make_interval(secs => 60000::float8 / 1000))
        ON CONFLICT (key) DO UPDATE SET
          total = CASE WHEN c.reset_at <= now() THEN EXCLUDED.total ELSE c.total + EXCLUDED.total END,
          reset_at = CASE WHEN c.reset_at <= now() THEN EXCLUDED.reset_at ELSE c.reset_at END
        RETURNING total`);
    expect(await seedHit(3)).toBe('3');
    const next = await store.hit(key, 60_000, 2);
    expect(next.count).toBe(5);
    expect(next.resetMs).toBeGreaterThan(59_000);
    expect(next.resetMs).toBeLessThanOrEqual(60_000);
    expect(await seedHit(1)).toBe('6');
    expect((await store.hit(key, 60_000, 0)).count).toBe(6);
    await store.close();
  });

  it('a read (amount 0) creates no row', async () => {
    const store = ownStore();
    const key = `read:${randomUUID()}`;
    expect(await store.hit(key, 30_000, 0)).toEqual({ count: 0, resetMs: 30_000 });
    expect(await own.sql(`SELECT count(*) FROM askdare_counters WHERE key = '${key}'`)).toBe('0');
    await store.close();
  });

  it('consume and refund follow the fixed-window rules', async () => {
    const store = ownStore();
    const key = `consume:${randomUUID()}`;
    const results = await Promise.all(
      Array.from({ length: 20 }, () => store.consume(key, { limit: 5, windowMs: 60_000 })),
    );
    expect(results.filter((r) => r.allowed)).toHaveLength(5);
    const refused = results.find((r) => !r.allowed)!;
    expect(refused).toMatchObject({ count: 5, remaining: 0 });
    expect(await store.refund(key, 2)).toMatchObject({ count: 3 });
    expect(await store.refund(key, 10)).toMatchObject({ count: 0 });
    expect(await store.refund(`none:${randomUUID()}`, 1)).toBeNull();
    await store.reset(key);
    expect((await store.hit(key, 60_000, 0)).count).toBe(0);
    await store.close();
  });

  it('rejects while the server is down and succeeds once it is back (pg_ctl stop / start)', async () => {
    const store = ownStore({ timeoutMs: 2_000 });
    const key = `restart:${randomUUID()}`;
    expect((await store.hit(key, 60_000, 1)).count).toBe(1);
    await own.halt();
    try {
      const error = await rejection(store.hit(key, 60_000, 1));
      expect(['ERR_CONNECTION', 'ERR_TIMEOUT', 'ERR_POSTGRES']).toContain(error.code);
    } finally {
      await own.start();
    }
    expect((await store.hit(key, 60_000, 1)).count).toBe(2);
    await own.restart();
    // The connection from before the restart is gone: at most one call fails, then it reconnects.
    await store.hit(key, 60_000, 1).catch(() => undefined);
    expect((await store.hit(key, 60_000, 0)).count).toBeGreaterThanOrEqual(2);
    await store.close();
  }, 60_000);

  it('reconnects after its connection is killed (pg_terminate_backend)', async () => {
    const store = ownStore();
    const key = `killed:${randomUUID()}`;
    expect((await store.hit(key, 60_000, 1)).count).toBe(1);
    const killed = await own.sql(
      "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
    );
    expect(Number(killed)).toBeGreaterThanOrEqual(1);
    // The first call after the kill may fail (its connection is gone); it never counts twice.
    let counted = 1;
    const first = await store.hit(key, 60_000, 1).then(
      () => {
        counted++;
        return 'ok';
      },
      (e: { code?: string }) => e.code,
    );
    expect(['ok', 'ERR_CONNECTION', 'ERR_POSTGRES']).toContain(first);
    expect((await store.hit(key, 60_000, 0)).count).toBe(counted);
    await store.close();
  }, 30_000);

  it('rejects the sliding window and the token bucket with ERR_UNSUPPORTED, for now', async () => {
    const store = ownStore();
    expect((await rejection(store.slidingWindow.increment(KEY_MARKER, 60_000))).code).toBe('ERR_UNSUPPORTED');
    const bucket = { capacity: 1, refill: 1, intervalMs: 1000 };
    expect((await rejection(store.tokenBucket(KEY_MARKER, bucket))).code).toBe('ERR_UNSUPPORTED');
    await store.close();
  });

  it('refuses calls after close() with ERR_CLOSED', async () => {
    const store = ownStore();
    await store.close();
    expect((await rejection(store.hit('k', 60_000, 1))).code).toBe('ERR_CLOSED');
  });
});
