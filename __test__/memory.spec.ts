import { execFile } from 'node:child_process';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { Worker } from 'node:worker_threads';
import { describe, expect, it } from 'vitest';
import { memoryStore } from '../index.js';
import { rateLimitStoreContract } from './contract.js';
import { operationsSuite } from './operations-suite.js';
import { hitFromWorkers } from './support/workers.js';

rateLimitStoreContract('memoryStore', () => memoryStore());
rateLimitStoreContract('memoryStore({ name })', () => memoryStore({ name: 'contract' }));
operationsSuite('memoryStore', () => memoryStore());

const HOUR = 3_600_000;
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

describe('memoryStore', () => {
  it('is not shared', () => {
    expect(memoryStore().shared).toBe(false);
  });

  describe('bad input', () => {
    const MARKER = '203.0.113.77-secret-key-marker';
    const cases: [string, unknown[], typeof TypeError | typeof RangeError, RegExp][] = [
      ['key is a number', [42, 1000, 1], TypeError, /key must be a string, got number/],
      ['key is undefined', [undefined, 1000, 1], TypeError, /key must be a string, got undefined/],
      ['key is null', [null, 1000, 1], TypeError, /key must be a string, got null/],
      ['key is a String object', [new String(MARKER), 1000, 1], TypeError, /key must be a string, got object/],
      ['windowMs is a string', [MARKER, '1000', 1], TypeError, /windowMs must be a number, got string/],
      ['windowMs is a bigint', [MARKER, 1000n, 1], TypeError, /windowMs must be a number, got bigint/],
      ['amount is missing', [MARKER, 1000], TypeError, /amount must be a number, got undefined/],
      ['amount is a string', [MARKER, 1000, '1'], TypeError, /amount must be a number, got string/],
      ['windowMs is 0', [MARKER, 0, 1], RangeError, /windowMs must be a positive safe integer/],
      ['windowMs is negative', [MARKER, -5, 1], RangeError, /windowMs must be a positive safe integer/],
      ['windowMs is fractional', [MARKER, 1.5, 1], RangeError, /windowMs must be a positive safe integer/],
      ['windowMs is NaN', [MARKER, NaN, 1], RangeError, /windowMs must be a positive safe integer/],
      ['windowMs is Infinity', [MARKER, Infinity, 1], RangeError, /windowMs must be a positive safe integer/],
      ['windowMs is past 2^53', [MARKER, 2 ** 53, 1], RangeError, /windowMs must be a positive safe integer/],
      ['amount is fractional', [MARKER, 1000, 0.5], RangeError, /amount must be a safe integer/],
      ['amount is NaN', [MARKER, 1000, NaN], RangeError, /amount must be a safe integer/],
      ['amount is past 2^53', [MARKER, 1000, 2 ** 53], RangeError, /amount must be a safe integer/],
      ['amount is -Infinity', [MARKER, 1000, -Infinity], RangeError, /amount must be a safe integer/],
      ['key is too long', [MARKER + 'x'.repeat(1024 * 1024), 1000, 1], RangeError, /key is \d+ UTF-16 units long/],
    ];

    for (const [what, args, kind, message] of cases) {
      it(`rejects when ${what}, changes nothing, and names no key`, async () => {
        const store = memoryStore();
        await store.hit(MARKER, 60_000, 3);
        const hit = store.hit as (...args: unknown[]) => Promise<unknown>;
        const error = await hit.apply(store, args).then(
          () => undefined,
          (e: unknown) => e,
        );
        expect(error).toBeInstanceOf(kind);
        expect((error as Error).message).toMatch(message);
        expect((error as Error).message).toMatch(/^ratestore: /);
        expect((error as { code: string }).code).toBe(kind === TypeError ? 'ERR_INVALID_ARG_TYPE' : 'ERR_OUT_OF_RANGE');
        expect(JSON.stringify(error) + String((error as Error).stack)).not.toContain(MARKER);
        expect(await store.hit(MARKER, 60_000, 0)).toMatchObject({ count: 3 });
        expect(store.size).toBe(1);
      });
    }

    it('refuses a count past the safe range with a RangeError that names no key, changing nothing', async () => {
      const store = memoryStore();
      await store.hit(MARKER, 60_000, -Number.MAX_SAFE_INTEGER);
      const error = await store.hit(MARKER, 60_000, -1).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(RangeError);
      expect((error as { code: string }).code).toBe('ERR_COUNT_RANGE');
      expect(String((error as Error).stack)).not.toContain(MARKER);
      expect((await store.hit(MARKER, 60_000, 0)).count).toBe(-Number.MAX_SAFE_INTEGER);
    });

    it('checks its options when it is made', () => {
      const make = memoryStore as (options?: unknown) => unknown;
      expect(() => make('big')).toThrow(TypeError);
      expect(() => make(null)).toThrow(TypeError);
      expect(() => make({ maxKeys: '10' })).toThrow(TypeError);
      expect(() => make({ maxkeys: 10 })).toThrow(/unknown option "maxkeys"/);
      expect(() => make({ name: 5 })).toThrow(TypeError);
      for (const maxKeys of [0, -1, 1.5, NaN, 2 ** 53]) expect(() => make({ maxKeys })).toThrow(RangeError);
      expect(() => make({ name: 'options-name', maxKeys: 10 })).not.toThrow();
      expect(() => make({ name: 'options-name', maxKeys: 11 })).toThrow(
        expect.objectContaining({ code: 'ERR_STORE_NAME_CONFLICT' }),
      );
    });
  });

  it('keeps counts exact near 2^53', async () => {
    const store = memoryStore();
    const big = 2 ** 53 - 10;
    expect((await store.hit('big', 60_000, big)).count).toBe(big);
    expect((await store.hit('big', 60_000, 7)).count).toBe(big + 7);
    expect((await store.hit('big', 60_000, -3)).count).toBe(big + 4);
  });

  it('refunds below zero without clamping', async () => {
    const store = memoryStore();
    await store.hit('r', 60_000, 2);
    expect((await store.hit('r', 60_000, -5)).count).toBe(-3);
    expect((await store.hit('r', 60_000, -5)).count).toBe(-8);
  });

  it('counts down resetMs from the end the first hit set', async () => {
    const store = memoryStore();
    const opened = performance.now();
    expect((await store.hit('w', 400, 1)).resetMs).toBe(400);
    // Timed here, not by the sleep: a timer runs on the loop's cached time and may fire early.
    await sleep(150);
    const elapsed = performance.now() - opened;
    const { resetMs } = await store.hit('w', 10_000, 1);
    expect(resetMs).toBeGreaterThan(0);
    expect(resetMs).toBeLessThanOrEqual(Math.ceil(400 - elapsed) + 1);
    await sleep(resetMs + 20);
    expect(await store.hit('w', 10_000, 1)).toEqual({ count: 1, resetMs: 10_000 });
  });

  it('reads need no room and open no window', async () => {
    const store = memoryStore({ maxKeys: 1 });
    await store.hit('held', HOUR * 24, 1);
    expect(await store.hit('other', 60_000, 0)).toEqual({ count: 0, resetMs: 60_000 });
    expect(store.size).toBe(1);
  });

  describe('maxKeys', () => {
    it('drops ended windows first', async () => {
      const store = memoryStore({ maxKeys: 2 });
      await store.hit('ends', 20, 1);
      await store.hit('stays', 60_000, 1);
      await sleep(40);
      expect((await store.hit('new', 60_000, 1)).count).toBe(1);
      expect((await store.hit('stays', 60_000, 0)).count).toBe(1);
    });

    it('then drops the soonest-ending short window', async () => {
      const store = memoryStore({ maxKeys: 3 });
      await store.hit('budget', HOUR * 24, 100);
      await store.hit('soon', 10_000, 1);
      await store.hit('later', HOUR, 1);
      expect((await store.hit('new', 60_000, 1)).count).toBe(1);
      expect((await store.hit('soon', 60_000, 0)).count).toBe(0);
      expect((await store.hit('later', 60_000, 0)).count).toBe(1);
      expect((await store.hit('budget', 60_000, 0)).count).toBe(100);
      expect(store.size).toBe(3);
    });

    it('refuses with ERR_STORE_FULL rather than forget a budget, and changes nothing', async () => {
      const store = memoryStore({ maxKeys: 2 });
      await store.hit('budget-a', HOUR + 1, 10);
      await store.hit('budget-b', HOUR * 24 * 30, 20);
      const error = await store.hit('203.0.113.9', 60_000, 1).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(Error);
      expect((error as { code: string }).code).toBe('ERR_STORE_FULL');
      expect((error as Error).message).toMatch(/maxKeys/);
      expect(String((error as Error).stack)).not.toContain('203.0.113.9');
      expect(store.size).toBe(2);
      expect((await store.hit('budget-a', 60_000, 1)).count).toBe(11);
      expect((await store.hit('budget-b', 60_000, 0)).count).toBe(20);
    });
  });

  it('gives memory back as windows end, with no hit needed', async () => {
    const store = memoryStore();
    await Promise.all(Array.from({ length: 10_000 }, (_, i) => store.hit(`short-${i}`, 30, 1)));
    await store.hit('long', 60_000, 1);
    expect(store.size).toBe(10_001);
    const deadline = Date.now() + 5_000;
    while (store.size > 1 && Date.now() < deadline) await sleep(50);
    expect(store.size).toBe(1);
  });

  it('shares a named store across modules: the same counters', async () => {
    const a = memoryStore({ name: 'modules' });
    const b = memoryStore({ name: 'modules' });
    await a.hit('k', 60_000, 2);
    expect((await b.hit('k', 60_000, 3)).count).toBe(5);
    expect((await memoryStore().hit('k', 60_000, 0)).count).toBe(0);
  });

  it('shares a named store across 4 worker threads, adding up exactly', async () => {
    const name = `workers-${process.pid}-${Date.now()}`;
    const hits = 2_500;
    // Held here too: each worker closes its store when done, and the last holder's close frees the table.
    const held = memoryStore({ name });
    const counts = await hitFromWorkers(4, { factory: 'memoryStore', options: { name }, key: 'shared', hits });
    expect(counts).toEqual(Array.from({ length: 4 * hits }, (_, i) => i + 1));
    expect((await held.hit('shared', 60_000, 0)).count).toBe(4 * hits);
    await held.close();
  });

  it('applies no older time to a window another worker thread opened: every resetMs <= windowMs', async () => {
    const name = `reset-${process.pid}-${Date.now()}`;
    const runs = Array.from({ length: 3 }, () => {
      const worker = new Worker(join(__dirname, 'fixtures', 'reset-worker.js'), {
        workerData: { name, key: 'shared', windowMs: 1, hits: 30_000 },
      });
      return new Promise<number[]>((resolve, reject) => {
        worker.once('message', resolve);
        worker.once('error', reject);
      }).finally(() => worker.terminate());
    });
    const resets = (await Promise.all(runs)).flat();
    expect(resets).toHaveLength(90_000);
    expect(resets.filter((resetMs) => resetMs > 1)).toEqual([]);
  });

  describe('a full store', () => {
    const fill = async (store: ReturnType<typeof memoryStore>, count: number, windowMs: number) => {
      for (let i = 0; i < count; i++) await store.hit(`held-${i}`, windowMs, 1);
    };

    it('refuses a fresh key without scanning its budgets', { timeout: 60_000 }, async () => {
      const store = memoryStore({ maxKeys: 200_000 });
      await fill(store, 200_000, 2 * HOUR);
      const start = performance.now();
      for (let i = 0; i < 2_000; i++) {
        const error = await store.hit(`fresh-${i}`, 60_000, 1).catch((e: unknown) => e);
        expect((error as { code: string }).code).toBe('ERR_STORE_FULL');
      }
      // A scan of the table per refusal takes seconds here; a bound this loose holds on a busy machine.
      expect(performance.now() - start).toBeLessThan(1_000);
    });

    it('turns over without a stall', { timeout: 60_000 }, async () => {
      const store = memoryStore({ maxKeys: 1_000_000 });
      await fill(store, 1_000_000, HOUR);
      const slow: number[] = [];
      for (let i = 0; i < 100_000; i++) {
        const start = performance.now();
        await store.hit(`fresh-${i}`, HOUR, 1);
        const ms = performance.now() - start;
        if (ms > 10) slow.push(ms);
      }
      // A scan of the table stalls a hit for tens of ms, 6 times here; a busy machine may preempt one or two.
      expect(slow.length).toBeLessThanOrEqual(2);
      expect(store.size).toBe(1_000_000);
    });
  });

  it('counts right in each copy of the package loaded on one thread (a cleared require cache)', async () => {
    const load = createRequire(__filename);
    const root = join(__dirname, '..');
    const first = load('..') as typeof import('../index.js');
    for (const id of Object.keys(load.cache)) {
      if (id.startsWith(root) && !id.includes('node_modules')) delete load.cache[id];
    }
    const second = load('..') as typeof import('../index.js');
    expect(second.memoryStore).not.toBe(first.memoryStore);
    const fresh = second.memoryStore();
    await fresh.hit('k', 60_000, 5);
    // Made by the first copy after the second was loaded: it must still use its own copy's numbers.
    const older = first.memoryStore();
    expect(await older.hit('k', 60_000, 2)).toEqual({ count: 2, resetMs: 60_000 });
    expect(await older.hit('k', 30_000, 1)).toMatchObject({ count: 3 });
    expect(await fresh.hit('k', 60_000, 1)).toMatchObject({ count: 6 });
  });

  it('lets a script that used it exit by itself', async () => {
    const { stdout } = await new Promise<{ stdout: string }>((resolve, reject) => {
      execFile(
        process.execPath,
        [join(__dirname, 'fixtures', 'exits-by-itself.js')],
        { timeout: 10_000 },
        (error, stdout) => (error ? reject(error) : resolve({ stdout })),
      );
    });
    expect(stdout.trim()).toBe('done');
  });

  it('rejects a microtask after the call, so an awaited refusal is cheap and an unhandled one is still reported', async () => {
    const store = memoryStore({ maxKeys: 1 });
    await store.hit('budget', 2 * HOUR, 1);
    const order: string[] = [];
    const refused = store.hit('fresh', 2 * HOUR, 1).catch((error: { code: string }) => order.push(error.code));
    order.push('returned');
    await refused;
    expect(order).toEqual(['returned', 'ERR_STORE_FULL']);
    // Nobody handles it: Node.js still reports the rejection and fails the script.
    const script = "require(process.argv[1]).memoryStore().hit('k', 0, 1);";
    const { code, stderr } = await new Promise<{ code: number | null; stderr: string }>((resolve) => {
      const child = execFile(
        process.execPath,
        ['-e', script, join(__dirname, '..')],
        { timeout: 10_000 },
        (_e, _o, stderr) => resolve({ code: child.exitCode, stderr }),
      );
    });
    expect(code).not.toBe(0);
    expect(stderr).toMatch(/ERR_OUT_OF_RANGE|windowMs must be a positive safe integer/);
  });
});
