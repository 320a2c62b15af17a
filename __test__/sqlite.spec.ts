import { randomUUID } from 'node:crypto';
import { spawn, execFileSync, type ChildProcess } from 'node:child_process';
import {
  closeSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  readFileSync,
  rmSync,
  statSync,
  writeFileSync,
  writeSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { DatabaseSync } from 'node:sqlite';
import { afterAll, describe, expect, it } from 'vitest';
import { metricsText, sqliteStore, type SqliteStoreOptions } from '../index.js';
import { rateLimitStoreContract } from './contract.js';
import { expressSuite } from './express-suite.js';
import { limiterSuite } from './limiter-suite.js';
import { operationsSuite } from './operations-suite.js';
import { universalSuite } from './universal-suite.js';

const dir = mkdtempSync(join(tmpdir(), 'ratestore-sqlite-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
const file = (name: string = randomUUID()) => join(dir, `${name}.sqlite3`);

// The shared suites' stores share one file (each suite's keys are its own); the adapters' suites
// count on fixed keys (the client's address): a file per store.
const suites = file('suites');
const make = (options: SqliteStoreOptions = {}) => sqliteStore({ path: suites, timeoutMs: 5_000, ...options });
rateLimitStoreContract('sqliteStore', () => make());
limiterSuite('sqliteStore', () => make());
operationsSuite('sqliteStore', () => make());
const isolated = () => make({ path: file() });
universalSuite('sqliteStore', isolated);
expressSuite('sqliteStore', isolated);
rateLimitStoreContract("sqliteStore(':memory:')", () => sqliteStore({ path: ':memory:' }));

const KEY_MARKER = '203.0.113.77-sqlite-key-marker';

/** The error `pending` rejects with; it must name no key and no path. */
async function rejection(pending: Promise<unknown>, path?: string): Promise<Error & { code?: string; sent?: boolean }> {
  const error = await pending.then(
    () => {
      throw new Error('expected a rejection');
    },
    (e: unknown) => e as Error & { code?: string; sent?: boolean },
  );
  expect(String(error.message)).not.toContain(KEY_MARKER);
  if (path !== undefined) expect(String(error.message)).not.toContain(path);
  expect(String(error.message)).not.toContain(dir);
  return error;
}

/** The lines a child writes, as they come. */
function lines(child: ChildProcess): AsyncIterableIterator<string> {
  return createInterface({ input: child.stdout! })[Symbol.asyncIterator]();
}

async function nextLine(it: AsyncIterableIterator<string>): Promise<string> {
  const { value, done } = await it.next();
  if (done) throw new Error('the child ended');
  return value;
}

/** Runs a mount or umount: as root itself, else through `sudo -n` (npm test's set-up needs one or the other). */
function privileged(command: string, args: string[]): void {
  if (process.getuid?.() === 0) execFileSync(command, args);
  else execFileSync('sudo', ['-n', command, ...args]);
}

/** A small tmpfs of `size`, for a full disk. */
function tmpfs(size: string): { path: string; unmount(): void } {
  const path = mkdtempSync(join(tmpdir(), 'ratestore-tmpfs-'));
  privileged('mount', ['-t', 'tmpfs', '-o', `size=${size}`, 'tmpfs', path]);
  return {
    path,
    unmount: () => {
      // Lazily: a store's thread may still be closing its file.
      privileged('umount', ['-l', path]);
      rmSync(path, { recursive: true, force: true });
    },
  };
}

describe('sqliteStore', () => {
  it('refuses bad options at construction, and makes no file', () => {
    expect(() => sqliteStore({ path: 1 as unknown as string })).toThrow(TypeError);
    expect(() => sqliteStore({ path: '' })).toThrow(RangeError);
    expect(() => sqliteStore({ path: 'a\0b' })).toThrow(RangeError);
    expect(() => sqliteStore({ timeoutMs: 0 })).toThrow(RangeError);
    expect(() => sqliteStore({ synchronous: 'off' as 'full' })).toThrow(RangeError);
    expect(() => sqliteStore({ sweepIntervalMs: -1 })).toThrow(RangeError);
    expect(() => sqliteStore({ nope: 1 } as unknown as SqliteStoreOptions)).toThrow(TypeError);
    expect(() => sqliteStore({ onError: 1 as unknown as () => void })).toThrow(TypeError);
  });

  it('opens ratestore.sqlite3 in the working directory by default, and counts survive a new process', async () => {
    const cwd = mkdtempSync(join(dir, 'cwd-'));
    const script = `const { sqliteStore } = require(${JSON.stringify(join(process.cwd(), 'index.js'))});
      const store = sqliteStore();
      store.hit('k', 600000, 2).then(({ count }) => store.close().then(() => console.log(count)));`;
    const run = () => execFileSync(process.execPath, ['-e', script], { cwd, encoding: 'utf8' }).trim();
    expect(run()).toBe('2');
    expect(existsSync(join(cwd, 'ratestore.sqlite3'))).toBe(true);
    // A restart reads the count the last process left.
    expect(run()).toBe('4');
  });

  it('keeps counts across close and reopen, and every operation on the file', async () => {
    const path = file();
    const first = sqliteStore({ path });
    await first.hit('fixed', 600_000, 3);
    await first.slidingWindow.increment('sliding', 600_000, 2);
    await first.tokenBucket('bucket', { capacity: 10, refill: 1, intervalMs: 600_000, cost: 4 });
    await first.close();
    await expect(first.hit('fixed', 600_000, 1)).rejects.toMatchObject({ code: 'ERR_CLOSED' });
    const again = sqliteStore({ path });
    expect((await again.hit('fixed', 600_000, 0)).count).toBe(3);
    expect((await again.slidingWindow.increment('sliding', 600_000, 0)).count).toBe(2);
    const bucket = await again.tokenBucket('bucket', { capacity: 10, refill: 1, intervalMs: 600_000, cost: 0 });
    expect(bucket.remaining).toBe(6);
    // The row layout the README documents.
    const db = new DatabaseSync(path);
    const rows = db.prepare('SELECT kind, CAST(key AS TEXT) AS key, a FROM ratestore_counters ORDER BY kind').all();
    db.close();
    expect(rows.map((r) => [r.kind, r.key])).toEqual([
      [0, 'fixed'],
      [1, 'sliding'],
      [2, 'bucket'],
    ]);
    await again.resetAll();
    expect((await again.hit('fixed', 600_000, 0)).count).toBe(0);
    await again.close();
  });

  it("with synchronous: 'full', counts as with 'normal' and keeps them across a reopen", async () => {
    const path = file();
    const store = sqliteStore({ path, synchronous: 'full' });
    const hits = await Promise.all(Array.from({ length: 20 }, () => store.hit('full', 600_000, 1)));
    expect(hits.map((h) => h.count).sort((x, y) => x - y)).toEqual(Array.from({ length: 20 }, (_, i) => i + 1));
    await store.close();
    const again = sqliteStore({ path });
    expect((await again.hit('full', 600_000, 0)).count).toBe(20);
    await again.close();
  });

  it('is shared on a file and not in memory; stats and metricsText count its work', async () => {
    const path = file();
    const a = sqliteStore({ path });
    const b = sqliteStore({ path });
    expect([a.shared, sqliteStore({ path: ':memory:' }).shared]).toEqual([true, false]);
    await Promise.all(Array.from({ length: 30 }, (_, i) => (i % 2 ? a : b).hit('both', 60_000, 1)));
    expect((await a.hit('both', 60_000, 0)).count).toBe(30);
    const stats = a.stats();
    expect(stats).toMatchObject({ kind: 'sqlite', calls: 16, inFlight: 0, errors: {} });
    expect(stats.commits).toBeGreaterThan(0);
    expect(stats.commits).toBeLessThanOrEqual(16);
    const text = metricsText({ a });
    expect(text).toContain('ratestore_calls_total{store="a",kind="sqlite"} 16');
    expect(text).toMatch(/ratestore_sqlite_commits_total\{store="a"\} \d+/);
    await Promise.all([a.close(), b.close()]);
  });

  it('keeps a key with a lone surrogate apart from its replacement', async () => {
    const store = sqliteStore({ path: file() });
    await store.hit('k\ud800', 60_000, 1);
    expect((await store.hit('k\ufffd', 60_000, 1)).count).toBe(1);
    expect((await store.hit('k\ud800', 60_000, 1)).count).toBe(2);
    await store.close();
  });

  it('sweeps expired rows in the background, in batches, and leaves live ones', async () => {
    const path = file();
    const store = sqliteStore({ path, sweepIntervalMs: 200 });
    await Promise.all(Array.from({ length: 1200 }, (_, i) => store.hit(`short${i}`, 50, 1)));
    await store.hit('long', 600_000, 1);
    await new Promise((resolve) => setTimeout(resolve, 1_500));
    expect(store.stats().swept).toBe(1200);
    const db = new DatabaseSync(path);
    const left = db.prepare('SELECT count(*) AS n FROM ratestore_counters').get();
    db.close();
    expect(left!.n).toBe(1);
    expect((await store.hit('long', 600_000, 0)).count).toBe(1);
    await store.close();
  });

  describe('calls alone run at once; calls together share a transaction', () => {
    /** Whether `pending` has settled after two turns of the microtask queue (no event-loop turn). */
    async function settledAtOnce(pending: Promise<unknown>): Promise<boolean> {
      let settled = false;
      void pending.then(() => (settled = true));
      await Promise.resolve();
      await Promise.resolve();
      return settled;
    }

    it('answers a call made alone within the microtask queue, counting as any other, and a burst in a few transactions', async () => {
      const store = sqliteStore({ path: file() });
      try {
        // The first call opens the file, on the store's thread.
        expect(await settledAtOnce(store.hit('alone', 600_000, 1))).toBe(false);
        // Once the thread is idle again (on a busy machine it may be a moment: until then the calls
        // queue for it), every call alone runs at once.
        let count = 1;
        for (let tries = 0; tries < 100; tries++) {
          const pending = store.hit('alone', 600_000, 1);
          const atOnce = await settledAtOnce(pending);
          expect((await pending).count).toBe(++count);
          if (atOnce) break;
          await new Promise((resolve) => setTimeout(resolve, 10));
        }
        for (let i = 0; i < 50; i++) {
          const pending = store.hit('alone', 600_000, 1);
          expect(await settledAtOnce(pending)).toBe(true);
          expect((await pending).count).toBe(++count);
        }
        const commits = store.stats().commits;
        const burst = await Promise.all(Array.from({ length: 200 }, () => store.hit('burst', 600_000, 1)));
        expect(burst.map((r) => r.count).sort((a, b) => a - b)).toEqual(Array.from({ length: 200 }, (_, i) => i + 1));
        // The first may run at once; the rest share the thread's transactions, each taking the calls
        // queued when it begins (200 calls alone would be 200).
        expect(store.stats().commits - commits).toBeLessThanOrEqual(50);
        expect((await store.hit('alone', 600_000, 0)).count).toBe(count);
      } finally {
        await store.close();
      }
    });

    it("with synchronous: 'full', runs no call on the caller's thread (each commit flushes the disk there)", async () => {
      const store = sqliteStore({ path: file(), synchronous: 'full' });
      try {
        await store.hit('full', 600_000, 1);
        await new Promise((resolve) => setTimeout(resolve, 10));
        expect(await settledAtOnce(store.hit('full', 600_000, 1))).toBe(false);
      } finally {
        await store.close();
      }
    });

    it("checkpoints the WAL on the store's thread: calls run at once keep it bounded", async () => {
      const path = file();
      const store = sqliteStore({ path });
      try {
        await store.hit('wal', 600_000, 1);
        // Each call alone commits one transaction of its own: without checkpoints, 6,000 of them grow
        // the WAL by at least a page (4 KiB) each, about 24 MiB.
        for (let i = 0; i < 6000; i++) await store.hit(`wal${i}`, 600_000, 1);
        await new Promise((resolve) => setTimeout(resolve, 200));
        const wal = statSync(`${path}-wal`).size;
        expect(wal).toBeLessThan(12 * 1024 * 1024);
        expect((await store.hit('wal5999', 600_000, 0)).count).toBe(1);
      } finally {
        await store.close();
      }
    });
  });

  describe('faults', () => {
    it('waits for another process that holds the write lock, up to timeoutMs, then rejects unsent', async () => {
      const path = file();
      const store = sqliteStore({ path, timeoutMs: 400 });
      await store.hit(KEY_MARKER, 600_000, 1);
      const holder = spawn(process.execPath, [join(__dirname, 'fixtures', 'sqlite-lock.js'), path]);
      const out = lines(holder);
      try {
        expect(await nextLine(out)).toBe('locked');
        const started = Date.now();
        // The wait is on the store's thread: the event loop runs on meanwhile.
        let ticks = 0;
        const timer = setInterval(() => ticks++, 20);
        const error = await rejection(store.hit(KEY_MARKER, 600_000, 1), path);
        clearInterval(timer);
        expect(Date.now() - started).toBeGreaterThanOrEqual(300);
        expect(ticks).toBeGreaterThanOrEqual(5);
        expect(error).toMatchObject({ code: 'ERR_TIMEOUT', sent: false });
        expect(error.message).toContain('SQLITE_BUSY');
        // A call made while the lock is held gets it once the other process lets go.
        const waiting = sqliteStore({ path, timeoutMs: 10_000 }).hit(KEY_MARKER, 600_000, 1);
        await new Promise((resolve) => setTimeout(resolve, 100));
        holder.stdin!.write('go\n');
        expect(await nextLine(out)).toBe('released');
        expect((await waiting).count).toBe(2);
        // The rejected hit counted nothing.
        expect((await store.hit(KEY_MARKER, 600_000, 0)).count).toBe(2);
        expect(store.stats().errors).toEqual({ ERR_TIMEOUT: 1 });
      } finally {
        holder.kill('SIGKILL');
        await store.close();
      }
    });

    it('rejects a read-only file with ERR_SQLITE, and works again once it is writable', async () => {
      // A read-only bind mount of a folder holding the file: as root, file modes would not stop a write.
      const rw = mkdtempSync(join(tmpdir(), 'ratestore-rw-'));
      const ro = mkdtempSync(join(tmpdir(), 'ratestore-ro-'));
      privileged('mount', ['--bind', rw, ro]);
      try {
        const maker = sqliteStore({ path: join(rw, 'counters.sqlite3') });
        await maker.hit(KEY_MARKER, 600_000, 1);
        await maker.close();
        privileged('mount', ['-o', 'remount,bind,ro', ro]);
        const path = join(ro, 'counters.sqlite3');
        const store = sqliteStore({ path, timeoutMs: 1_000 });
        const error = await rejection(store.hit(KEY_MARKER, 600_000, 1), path);
        expect(error).toMatchObject({ code: 'ERR_SQLITE', sent: false });
        expect(error.message).toMatch(/SQLITE_READONLY|SQLITE_CANTOPEN/);
        await expect(store.ping()).rejects.toMatchObject({ code: 'ERR_SQLITE', sent: false });
        privileged('mount', ['-o', 'remount,bind,rw', ro]);
        // The next call opens the file again; the rejected hit counted nothing.
        expect((await store.hit(KEY_MARKER, 600_000, 1)).count).toBe(2);
        await store.close();
      } finally {
        privileged('umount', ['-l', ro]);
        rmSync(ro, { recursive: true, force: true });
        rmSync(rw, { recursive: true, force: true });
      }
    });

    it('rejects on a full disk with ERR_SQLITE, counts nothing of the rejected calls, and works again', async () => {
      const fs = tmpfs('1m');
      try {
        const path = join(fs.path, 'counters.sqlite3');
        const store = sqliteStore({ path, timeoutMs: 2_000, sweepIntervalMs: 0 });
        await store.hit('small', 600_000, 1);
        writeFileSync(join(fs.path, 'filler'), Buffer.alloc(700 * 1024));
        const big = (i: number) => `${KEY_MARKER}:${i}:${'x'.repeat(4000)}`;
        const answered = new Set<number>();
        let error: (Error & { code?: string; sent?: boolean }) | undefined;
        for (let i = 0; i < 400 && error === undefined; i += 8) {
          const results = await Promise.allSettled(
            Array.from({ length: 8 }, (_, j) => store.hit(big(i + j), 600_000, 1)),
          );
          results.forEach((r, j) => {
            if (r.status === 'fulfilled') answered.add(i + j);
            else error = r.reason;
          });
        }
        expect(error).toBeDefined();
        expect(error).toMatchObject({ code: 'ERR_SQLITE', sent: false });
        expect(error!.message).toContain('SQLITE_FULL');
        expect(error!.message).not.toContain(KEY_MARKER);
        rmSync(join(fs.path, 'filler'));
        // Every answered hit is there once; no rejected one counted.
        const last = Math.max(...answered) + 8;
        for (let i = 0; i <= last; i++) {
          expect((await store.hit(big(i), 600_000, 0)).count).toBe(answered.has(i) ? 1 : 0);
        }
        expect((await store.hit('small', 600_000, 1)).count).toBe(2);
        await store.close();
      } finally {
        fs.unmount();
      }
    });

    it('rejects a file that is not a database, and a corrupted one, with ERR_SQLITE, and leaves them as they were', async () => {
      const foreign = file();
      const bytes = Buffer.from(`not a database ${KEY_MARKER} `.repeat(400));
      writeFileSync(foreign, bytes);
      const store = sqliteStore({ path: foreign });
      const error = await rejection(store.hit(KEY_MARKER, 600_000, 1), foreign);
      expect(error).toMatchObject({ code: 'ERR_SQLITE', sent: false });
      expect(error.message).toContain('SQLITE_NOTADB');
      await expect(store.ping()).rejects.toMatchObject({ code: 'ERR_SQLITE' });
      await store.close();
      expect(Buffer.compare(readFileSync(foreign), bytes)).toBe(0);

      // A real database whose pages were overwritten.
      const corrupt = file();
      const maker = sqliteStore({ path: corrupt });
      await Promise.all(Array.from({ length: 2000 }, (_, i) => maker.hit(`key${i}`, 600_000, 1)));
      await maker.close();
      const db = new DatabaseSync(corrupt);
      db.exec('PRAGMA wal_checkpoint(TRUNCATE)');
      db.close();
      const fd = openSync(corrupt, 'r+');
      writeSync(fd, Buffer.alloc(8 * 4096, 0xa5), 0, 8 * 4096, 4096);
      closeSync(fd);
      const reader = sqliteStore({ path: corrupt });
      const results = await Promise.allSettled(
        Array.from({ length: 2000 }, (_, i) => reader.hit(`key${i}`, 600_000, 0)),
      );
      const rejected = results.filter((r) => r.status === 'rejected');
      expect(rejected.length).toBeGreaterThan(0);
      for (const r of rejected) {
        expect((r as PromiseRejectedResult).reason).toMatchObject({ code: 'ERR_SQLITE', sent: false });
        expect((r as PromiseRejectedResult).reason.message).toMatch(/SQLITE_CORRUPT|SQLITE_NOTADB/);
      }
      // Whatever answered, answered what was counted: never a made-up count.
      for (const r of results) if (r.status === 'fulfilled') expect(r.value.count).toBe(1);
      await reader.close();
    });

    it("refuses a table of that name that is not ratestore's", async () => {
      const path = file();
      const db = new DatabaseSync(path);
      db.exec('CREATE TABLE ratestore_counters (id INTEGER PRIMARY KEY, name TEXT)');
      db.exec('CREATE TABLE other (x)');
      db.close();
      const store = sqliteStore({ path });
      const error = await rejection(store.hit(KEY_MARKER, 600_000, 1), path);
      expect(error).toMatchObject({ code: 'ERR_SQLITE', sent: false });
      expect(error.message).toContain("not ratestore's");
      await store.close();
    });

    it('rejects a path whose folder is missing, naming no path', async () => {
      const path = join(dir, 'missing-folder', `${KEY_MARKER}.sqlite3`);
      const error = await rejection(sqliteStore({ path }).hit('k', 600_000, 1), path);
      expect(error).toMatchObject({ code: 'ERR_SQLITE', sent: false });
      expect(error.message).toContain('SQLITE_CANTOPEN');
      mkdirSync(join(dir, 'missing-folder'));
    });
  });

  describe('several processes on one file', () => {
    const logs = new WeakMap<ChildProcess, string>();
    const load = (path: string, keys: string[], ms: number) => {
      const log = join(dir, `answers-${randomUUID()}.log`);
      const fixture = join(__dirname, 'fixtures', 'sqlite-load.js');
      const child = spawn(process.execPath, [fixture, path, keys.join(','), '40', String(ms), log]);
      logs.set(child, log);
      return child;
    };

    /** Runs a child to its end (or its kill): each answered count per key index, from its log once it ended. */
    function collect(child: ChildProcess, keys: number) {
      const answered: number[][] = Array.from({ length: keys }, () => []);
      let ready!: () => void;
      const isReady = new Promise<void>((resolve) => (ready = resolve));
      let done = false;
      const ended = new Promise<void>((resolve) => {
        createInterface({ input: child.stdout! })
          .on('line', (line) => {
            if (line === 'ready') return ready();
            if (line.startsWith('done')) {
              expect(line).toBe('done 0');
              done = true;
            }
          })
          .on('close', resolve);
      }).then(() => {
        const log = logs.get(child)!;
        const text = existsSync(log) ? readFileSync(log, 'utf8') : '';
        for (const line of text.split('\n').filter(Boolean)) {
          const [count, k] = line.split(' ').map(Number);
          answered[k].push(count);
        }
      });
      return { answered, isReady, ended, done: () => done };
    }

    it('3 processes x 40 in flight on shared keys: exact totals, each count answered once', async () => {
      const path = file();
      const keys = ['a', 'b', 'c', 'd'];
      const runs = [0, 1, 2].map(() => collect(load(path, keys, 3_000), keys.length));
      await Promise.all(runs.map((r) => r.ended));
      expect(runs.map((r) => r.done())).toEqual([true, true, true]);
      const store = sqliteStore({ path });
      for (let k = 0; k < keys.length; k++) {
        const all = runs.flatMap((r) => r.answered[k]).sort((x, y) => x - y);
        expect(all.length).toBeGreaterThan(100);
        // No lost and no doubled hit: the counts handed out are exactly 1..n, and n is on disk.
        expect(all).toEqual(Array.from({ length: all.length }, (_, i) => i + 1));
        expect((await store.hit(keys[k], 600_000, 0)).count).toBe(all.length);
      }
      await store.close();
    }, 60_000);

    it('a process killed with SIGKILL mid-load: every hit it was answered is on disk', async () => {
      const path = file();
      const keys = ['x', 'y'];
      const children = [0, 1, 2].map(() => load(path, keys, 3_000));
      const runs = children.map((c) => collect(c, keys.length));
      await Promise.all(runs.map((r) => r.isReady));
      await new Promise((resolve) => setTimeout(resolve, 1_200));
      children[0].kill('SIGKILL');
      await Promise.all(runs.map((r) => r.ended));
      expect(runs.map((r) => r.done())).toEqual([false, true, true]);
      expect(runs[0].answered.flat().length).toBeGreaterThan(0);
      const store = sqliteStore({ path });
      for (let k = 0; k < keys.length; k++) {
        const all = runs.flatMap((r) => r.answered[k]).sort((x, y) => x - y);
        const onDisk = (await store.hit(keys[k], 600_000, 0)).count;
        // Each count was answered once, and every answered hit is counted; at most the killed
        // process's calls in flight (40) committed without their answer being read.
        expect(new Set(all).size).toBe(all.length);
        expect(all[all.length - 1]).toBeLessThanOrEqual(onDisk);
        expect(onDisk - all.length).toBeGreaterThanOrEqual(0);
        expect(onDisk - all.length).toBeLessThanOrEqual(40);
      }
      await store.close();
    }, 60_000);
  });
});
