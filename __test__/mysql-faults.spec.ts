// mysqlStore against a real MariaDB that misbehaves: restarted, its connections killed, read_only on, a
// wrong password, a row held by another session past the lock wait, TLS; and its settings (the URL read
// lazily, createTable, tables made by many stores at once, long keys). Each test asserts what the caller
// sees: a clear code, a `sent` that tells the truth, no key, password or URL in any message.
import { randomUUID } from 'node:crypto';
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { mysqlStore, type MysqlStoreOptions } from '../index.js';
import { PASSWORD, startMariadb, type MariadbServer } from './support/mariadb.js';
import { makeCertificates } from './support/redis.js';
import { envScope, urlFromEnvCases } from './support/env.js';

const KEY_MARKER = '203.0.113.77-my-key-marker';

let own: MariadbServer;
beforeAll(async () => {
  own = await startMariadb();
}, 120_000);
afterAll(() => own?.stop());

const table = () => `t_${randomUUID().replace(/-/g, '').slice(0, 20)}`;
const ownStore = (options: MysqlStoreOptions = {}) => mysqlStore({ url: own.url, timeoutMs: 3_000, ...options });

/** The error `pending` rejects with; it must name no key, password or URL. */
async function rejection(pending: Promise<unknown>): Promise<Error & { code?: string; sent?: boolean }> {
  const error = await pending.then(
    () => {
      throw new Error('expected a rejection');
    },
    (e: unknown) => e as Error & { code?: string; sent?: boolean },
  );
  const hex = Buffer.from(KEY_MARKER).toString('hex');
  for (const secret of [KEY_MARKER, hex, PASSWORD, 'mysql://']) expect(String(error.message)).not.toContain(secret);
  return error;
}

const withEnv = envScope(['DATABASE_URL', 'MYSQL_URL']);

/** A root session of its own that keeps what it runs open (a transaction, its row locks) until end(). */
function session(server: MariadbServer) {
  const child = spawn('mariadb', ['--no-defaults', '-S', server.socket, '-uroot', '-N', '-B', '-n', 'ratestore'], {
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  let out = '';
  child.stdout.on('data', (d) => (out += d));
  child.stderr.on('data', (d) => (out += d));
  return {
    /** Runs `sql` and waits for `marker` in its output. */
    async run(sql: string): Promise<void> {
      const marker = `done-${randomUUID()}`;
      child.stdin.write(`${sql};\nSELECT '${marker}';\n`);
      for (let i = 0; i < 500 && !out.includes(marker); i++) await new Promise((r) => setTimeout(r, 10));
      if (!out.includes(marker)) throw new Error('the holding session did not answer');
    },
    end: () =>
      new Promise<void>((resolve) => {
        child.once('exit', () => resolve());
        child.stdin.end('ROLLBACK;\n');
      }),
  };
}

/** The server's sessions of the store's user. */
async function storeSessions(): Promise<number[]> {
  const ids = await own.sql("SELECT id FROM information_schema.processlist WHERE user = 'ratestore'");
  return ids ? ids.split('\n').map(Number) : [];
}

describe('mysqlStore settings', () => {
  urlFromEnvCases({
    create: () => mysqlStore(),
    variable: 'MYSQL_URL',
    url: () => own.url,
    badUrl: 'mysql://nobody@127.0.0.1:1/none',
    withEnv,
    rejection,
    key: KEY_MARKER,
  });

  it('refuses bad options with a TypeError or RangeError', () => {
    expect(() => mysqlStore({ url: 1 as unknown as string })).toThrow(TypeError);
    expect(() => mysqlStore({ timeoutMs: 0 })).toThrow(RangeError);
    expect(() => mysqlStore({ timeoutMs: 2 ** 32 })).toThrow(RangeError);
    expect(() => mysqlStore({ connections: 65 })).toThrow(RangeError);
    expect(() => mysqlStore({ nope: 1 } as unknown as MysqlStoreOptions)).toThrow(TypeError);
    expect(() => mysqlStore({ sslMode: 'allow' as 'DISABLED' })).toThrow(RangeError);
    expect(() => mysqlStore({ tls: { cert: 'x' } as unknown as { ca: string } })).toThrow(TypeError);
  });

  it('names an unknown URL parameter, never its value', async () => {
    const error = await rejection(ownStore({ url: `${own.url}?pgbouncer=${PASSWORD}` }).hit(KEY_MARKER, 60_000, 1));
    expect(error.code).toBe('ERR_CONFIG');
    expect(error.message).toContain('"pgbouncer"');
    // Parameters other clients put in MySQL URLs and that mean nothing here are accepted.
    const store = ownStore({ url: `${own.url}?connection_limit=1&sslaccept=accept_invalid_certs&ssl-mode=DISABLED` });
    await store.ping();
    await store.close();
  });

  it('with createTable false, nothing created rejects with ERR_MYSQL (1305, the missing procedure) and creates nothing', async () => {
    const name = table();
    const error = await rejection(ownStore({ table: name, createTable: false }).hit(KEY_MARKER, 60_000, 1));
    expect(error.code).toBe('ERR_MYSQL');
    expect(error.message).toContain('1305');
    expect(error.message).toContain('docs/mysql.sql');
    expect(await own.sql(`SELECT COUNT(*) FROM information_schema.tables WHERE table_name = '${name}'`)).toBe('0');
  });

  it('runs on the tables docs/mysql.sql makes, with createTable false', async () => {
    const name = table();
    const sql = readFileSync(join(__dirname, '..', 'docs', 'mysql.sql'), 'utf8').replaceAll('askdare_counters', name);
    await new Promise<void>((resolve, reject) => {
      const child = spawn('mariadb', ['--no-defaults', '-S', own.socket, '-uroot', 'ratestore']);
      child.once('exit', (code) => (code === 0 ? resolve() : reject(new Error(`mariadb exited ${code}`))));
      child.stdin.end(sql);
    });
    const store = ownStore({ table: name, createTable: false });
    expect((await store.hit('k', 60_000, 3)).count).toBe(3);
    expect((await store.slidingWindow.increment('k', 60_000, 1)).count).toBe(1);
    expect((await store.tokenBucket('k', { capacity: 2, refill: 1, intervalMs: 1000 })).remaining).toBe(1);
    await store.close();
  });

  it('creates its tables on first use, once, when many stores start at once', async () => {
    const name = table();
    const stores = Array.from({ length: 8 }, () => ownStore({ table: name }));
    const hits = await Promise.all(stores.map((store) => store.hit('k', 60_000, 1)));
    expect(hits.map((h) => h.count).sort((a, b) => a - b)).toEqual([1, 2, 3, 4, 5, 6, 7, 8]);
    expect(await own.sql(`SELECT total FROM ${name} WHERE k = 'k'`)).toBe('8');
    await Promise.all(stores.map((store) => store.close()));
  });

  it('keeps keys of any length apart, the long ones hashed into the index', async () => {
    const name = table();
    const store = ownStore({ table: name });
    const long = 'x'.repeat(1 << 20);
    const near = 'x'.repeat((1 << 20) - 1);
    expect((await store.hit(long, 60_000, 2)).count).toBe(2);
    expect((await store.hit(near, 60_000, 1)).count).toBe(1);
    expect((await store.hit('x'.repeat(255), 60_000, 1)).count).toBe(1);
    expect((await store.hit(long, 60_000, 0)).count).toBe(2);
    expect(await own.sql(`SELECT COUNT(*) FROM ${name}`)).toBe('3');
    // Case and trailing spaces make other keys (the column is binary).
    await store.hit('Key', 60_000, 1);
    expect((await store.hit('key', 60_000, 1)).count).toBe(1);
    expect((await store.hit('key ', 60_000, 1)).count).toBe(1);
    await store.close();
  });

  it('hits on one key made together answer as one after another, also where their sum would leave the safe range', async () => {
    const store = ownStore();
    const key = `fold:${randomUUID()}`;
    const counts = await Promise.all(Array.from({ length: 50 }, (_, i) => store.hit(key, 60_000, 1 + (i % 3))));
    const total = Array.from({ length: 50 }, (_, i) => 1 + (i % 3)).reduce((a, b) => a + b, 0);
    // In the order made: each count is the one before plus its own amount.
    counts.forEach((c, i) => expect(c.count).toBe((i === 0 ? 0 : counts[i - 1].count) + 1 + (i % 3)));
    expect(counts[49].count).toBe(total);
    const near = `fold-range:${randomUUID()}`;
    await store.hit(near, 60_000, Number.MAX_SAFE_INTEGER - 3);
    const outcomes = await Promise.allSettled(Array.from({ length: 5 }, () => store.hit(near, 60_000, 1)));
    expect(
      outcomes.map((o) => (o.status === 'fulfilled' ? o.value.count : (o.reason as { code: string }).code)),
    ).toEqual([
      Number.MAX_SAFE_INTEGER - 2,
      Number.MAX_SAFE_INTEGER - 1,
      Number.MAX_SAFE_INTEGER,
      'ERR_COUNT_RANGE',
      'ERR_COUNT_RANGE',
    ]);
    await store.close();
  });

  it('counts on the database clock and answers the window as the other stores', async () => {
    const store = ownStore();
    const key = `clock:${randomUUID()}`;
    const first = await store.hit(key, 1_000, 1);
    expect(first).toEqual({ count: 1, resetMs: 1_000 });
    await new Promise((r) => setTimeout(r, 1_100));
    expect(await store.hit(key, 1_000, 1)).toEqual({ count: 1, resetMs: 1_000 });
    await store.close();
  });
});

describe('mysqlStore faults', () => {
  it("fixed-window hits on several keys made together go as one upsert, not a procedure call each: each answers its running count in call order, a key's window set by its first hit; a hit past the safe range fails alone", async () => {
    const name = table();
    const store = ownStore({ table: name, timeoutMs: 5_000, connections: 1 });
    const run = randomUUID();
    const MAX = Number.MAX_SAFE_INTEGER;
    const full = `hits:${run}:full`;
    await store.hit(full, 60_000, MAX - 5);
    const procedureCalls = async () =>
      Number((await own.sql("SHOW GLOBAL STATUS LIKE 'Com_call_procedure'")).split('\t')[1]);
    // The store's one connection is kept busy by a hit on a row another session holds, so that the
    // hits made next all wait in the queue and go out as one batch, whatever the machine's load.
    const gate = `hits:${run}:gate`;
    await store.hit(gate, 60_000, 1);
    const holder = session(own);
    await holder.run(`START TRANSACTION; SELECT * FROM ${name} WHERE k = '${gate}' FOR UPDATE`);
    const before = await procedureCalls();
    const gated = store.hit(gate, 60_000, 1);
    const waiting = () => own.sql("SELECT COUNT(*) FROM information_schema.innodb_trx WHERE trx_state = 'LOCK WAIT'");
    for (let i = 0; i < 500 && (await waiting()) === '0'; i++) await new Promise((r) => setTimeout(r, 10));
    expect(await waiting()).toBe('1');
    // One turn: 40 keys hit in turn, 5 rounds, key i's amounts 1, 2, 3, ...; its first hit's window 60 s, the later ones' 5 s.
    const keys = Array.from({ length: 40 }, (_, i) => `hits:${run}:${i}`);
    const calls: Promise<{ count: number; resetMs: number }>[] = [];
    for (let round = 0; round < 5; round++) {
      for (const key of keys) calls.push(store.hit(key, round === 0 ? 60_000 : 5_000, round + 1));
    }
    await holder.end();
    expect((await gated).count).toBe(2);
    const answers = await Promise.all(calls);
    for (let round = 0; round < 5; round++) {
      for (let i = 0; i < keys.length; i++) {
        const { count, resetMs } = answers[round * keys.length + i];
        expect(count).toBe(((round + 1) * (round + 2)) / 2);
        expect(resetMs).toBeGreaterThan(55_000);
        expect(resetMs).toBeLessThanOrEqual(60_000);
      }
    }
    // The gated hit was one call; the 200 behind it went as one statement, not a call per key.
    expect((await procedureCalls()) - before).toBeLessThan(5);
    // Hits that cross the safe range, made together with others: the batch goes again as calls, and only the hit past the range fails.
    const settled = await Promise.allSettled([
      store.hit(keys[0], 60_000, 1),
      store.hit(full, 60_000, 2),
      store.hit(full, 60_000, 2),
      store.hit(full, 60_000, 2),
      store.hit(keys[1], 60_000, 1),
    ]);
    const value = (i: number) => (settled[i] as PromiseFulfilledResult<{ count: number }>).value.count;
    expect([value(0), value(1), value(2), value(4)]).toEqual([16, MAX - 3, MAX - 1, 16]);
    const range = (settled[3] as PromiseRejectedResult).reason;
    expect(range).toBeInstanceOf(RangeError);
    expect(range.code).toBe('ERR_COUNT_RANGE');
    expect((await store.hit(full, 60_000, 0)).count).toBe(MAX - 1);
    expect((await store.hit(keys[2], 60_000, 0)).count).toBe(15);
    await store.close();
  });

  it('rejects a wrong password with ERR_AUTH, sent false, naming neither password nor URL', async () => {
    const url = own.url.replace(PASSWORD, 'wrong-secret-7d1f');
    const error = await rejection(mysqlStore({ url }).hit(KEY_MARKER, 60_000, 1));
    expect(error.code).toBe('ERR_AUTH');
    expect(error.sent).toBe(false);
    expect(error.message).toContain('1045');
    expect(error.message).not.toContain('wrong-secret-7d1f');
  });

  it('rejects while the server is down and counts again once it is back (restart)', async () => {
    const name = table();
    const store = ownStore({ table: name, timeoutMs: 2_000 });
    const key = `restart:${randomUUID()}`;
    expect((await store.hit(key, 60_000, 1)).count).toBe(1);
    await own.halt();
    try {
      const error = await rejection(store.hit(KEY_MARKER, 60_000, 1));
      expect(['ERR_CONNECTION', 'ERR_TIMEOUT']).toContain(error.code);
      expect(error.sent).toBe(false);
    } finally {
      await own.start();
    }
    // Backing off after the failed connects: within a few seconds it connects again.
    let count = 0;
    for (let i = 0; i < 60 && count === 0; i++) {
      count = await store.hit(key, 60_000, 1).then(
        (r) => r.count,
        () => 0,
      );
      if (count === 0) await new Promise((r) => setTimeout(r, 200));
    }
    expect(count).toBe(2);
    // The connections from before the restart are noticed as closed, not used.
    const after = await Promise.all(Array.from({ length: 20 }, () => store.hit(key, 60_000, 1)));
    expect(after.map((r) => r.count).sort((a, b) => a - b)[19]).toBe(22);
    await store.close();
  }, 60_000);

  it('loses no call to its connections being killed while idle, and one killed mid-call rejects sent: true', async () => {
    const name = table();
    const store = ownStore({ table: name, connections: 4 });
    const key = `killed:${randomUUID()}`;
    await Promise.all(Array.from({ length: 40 }, (_, i) => store.hit(`${key}:${i % 8}`, 60_000, 1)));
    const before = await storeSessions();
    expect(before.length).toBeGreaterThan(0);
    for (const id of before) await own.sql(`KILL ${id}`).catch(() => undefined);
    await new Promise((r) => setTimeout(r, 100));
    const results = await Promise.all(Array.from({ length: 40 }, (_, i) => store.hit(`${key}:${i % 8}`, 60_000, 1)));
    expect(results.map((r) => r.count).sort((a, b) => a - b)[39]).toBe(10);
    // Killed while a call waits on a row another session holds: that call rejects, sent true.
    const holder = session(own);
    await holder.run(`INSERT INTO ${name} VALUES ('held', 1, 9999999999999999)`);
    await holder.run(`START TRANSACTION; SELECT * FROM ${name} WHERE k = 'held' FOR UPDATE`);
    // Its rejection is awaited from the start, so that it is never unhandled while the kills run.
    const waiting = rejection(store.hit('held', 60_000, 1));
    await new Promise((r) => setTimeout(r, 300));
    for (const id of await storeSessions()) await own.sql(`KILL ${id}`).catch(() => undefined);
    const error = await waiting;
    expect(error.code).toBe('ERR_CONNECTION');
    expect(error.sent).toBe(true);
    await holder.end();
    expect((await store.hit(`${key}:0`, 60_000, 1)).count).toBe(11);
    await store.close();
  }, 60_000);

  it('rejects writes with ERR_MYSQL (1290) while read_only is on, and counts again once it is off', async () => {
    const store = ownStore();
    const key = `ro:${randomUUID()}`;
    expect((await store.hit(key, 60_000, 1)).count).toBe(1);
    await own.sql('SET GLOBAL read_only = ON');
    try {
      const error = await rejection(store.hit(KEY_MARKER, 60_000, 1));
      expect(error.code).toBe('ERR_MYSQL');
      expect(error.message).toContain('1290');
      expect(error.message).toContain('read-only');
      expect(error.sent).toBe(true);
    } finally {
      await own.sql('SET GLOBAL read_only = OFF');
    }
    expect((await store.hit(key, 60_000, 1)).count).toBe(2);
    await store.close();
  });

  it('a row held by another session, hit together with other keys: the batch waits on it once, not twice, and only its own hit fails', async () => {
    const name = table();
    const store = ownStore({ table: name, timeoutMs: 4_000, connections: 1 });
    await store.hit('held', 60_000, 5);
    const holder = session(own);
    await holder.run(`START TRANSACTION; SELECT * FROM ${name} WHERE k = 'held' FOR UPDATE`);
    // A turn of hits on 20 keys (one of them the held one, last): they go together, as one upsert,
    // which locks the rows it needs at once or not at all (NOWAIT), so the batch goes on at once as
    // calls, the others ahead of the held one, and waits on the held row once (2 s, half of timeoutMs).
    // An upsert that waited on it too would leave the batch no time: every hit of it would time out.
    await store.hit('first', 60_000, 1);
    const started = Date.now();
    const others = Array.from({ length: 19 }, (_, i) =>
      store.hit(`other:${i}`, 60_000, 2).then((a) => [a.count, Date.now() - started]),
    );
    const onHeld = store.hit('held', 60_000, 1).then(
      () => 'counted',
      (e) => e,
    );
    const answered = await Promise.all(others);
    for (const [count, ms] of answered) {
      expect(count).toBe(2);
      expect(ms).toBeLessThan(3_500);
    }
    const held = await onHeld;
    await holder.end();
    if (held !== 'counted') expect((held as Error & { code?: string }).code).toBe('ERR_TIMEOUT');
    expect((await store.hit('held', 60_000, 0)).count).toBe(held === 'counted' ? 6 : 5);
    await store.close();
  }, 30_000);

  it('a row held by another session stalls only its key: its calls time out within timeoutMs, rolled back, and the others answer', async () => {
    const name = table();
    const store = ownStore({ table: name, timeoutMs: 2_000, connections: 4 });
    await store.hit('held', 60_000, 5);
    await store.hit('free', 60_000, 1);
    const holder = session(own);
    await holder.run(`START TRANSACTION; SELECT * FROM ${name} WHERE k = 'held' FOR UPDATE`);
    const started = Date.now();
    const onHeld = Array.from({ length: 5 }, () =>
      store.hit('held', 60_000, 1).then(
        () => 'counted',
        (e) => e,
      ),
    );
    const others: number[] = [];
    for (let i = 0; i < 20; i++) {
      const t = Date.now();
      await store.hit(`free:${i % 3}`, 60_000, 1);
      others.push(Date.now() - t);
    }
    // Every other key answered well within timeoutMs while the row was held.
    expect(Math.max(...others)).toBeLessThan(1_500);
    const outcomes = await Promise.all(onHeld);
    expect(Date.now() - started).toBeLessThan(2_000 + 1_500);
    const timedOut = outcomes.filter((o) => o instanceof Error) as (Error & { code?: string; sent?: boolean })[];
    expect(timedOut.length).toBeGreaterThan(0);
    for (const e of timedOut) {
      expect(e.code).toBe('ERR_TIMEOUT');
      expect(e.sent).toBe(true);
    }
    await holder.end();
    // The calls told ERR_TIMEOUT with the 1205 lock wait counted nothing; none is left waiting on the server.
    const counted = outcomes.filter((o) => o === 'counted').length;
    const lockWaits = timedOut.filter((e) => e.message.includes('1205')).length;
    const total = Number(await own.sql(`SELECT total FROM ${name} WHERE k = 'held'`));
    expect(total).toBeGreaterThanOrEqual(5 + counted);
    expect(total).toBeLessThanOrEqual(5 + outcomes.length - lockWaits);
    await new Promise((r) => setTimeout(r, 1_500));
    const waiting = await own.sql(
      "SELECT COUNT(*) FROM information_schema.processlist WHERE user = 'ratestore' AND command <> 'Sleep'",
    );
    expect(waiting).toBe('0');
    expect((await store.hit('held', 60_000, 0)).count).toBe(total);
    await store.close();
  }, 30_000);
});

describe('mysqlStore over TLS', () => {
  let tlsServer: MariadbServer;
  let dir: string;
  let ca: string;
  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'ratestore-mytls-'));
    const certs = await makeCertificates(dir);
    ca = readFileSync(certs.ca, 'utf8');
    tlsServer = await startMariadb({ settings: { 'ssl-cert': certs.cert, 'ssl-key': certs.key } });
    await tlsServer.sql("ALTER USER 'ratestore'@'%' REQUIRE SSL");
  }, 120_000);
  afterAll(async () => {
    await tlsServer?.stop();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it('connects with VERIFY_IDENTITY against tls.ca, and by default (PREFERRED)', async () => {
    const verified = mysqlStore({ url: tlsServer.url, sslMode: 'VERIFY_IDENTITY', tls: { ca } });
    expect((await verified.hit('k', 60_000, 1)).count).toBe(1);
    await verified.close();
    const preferred = mysqlStore({ url: tlsServer.url });
    expect((await preferred.hit('k', 60_000, 1)).count).toBe(2);
    await preferred.close();
  });

  it('refuses a certificate it cannot check, and a user that requires TLS without it', async () => {
    const unknown = await rejection(
      mysqlStore({ url: tlsServer.url, sslMode: 'VERIFY_IDENTITY' }).hit(KEY_MARKER, 60_000, 1),
    );
    expect(unknown.code).toBe('ERR_CONNECTION');
    expect(unknown.sent).toBe(false);
    const plain = await rejection(mysqlStore({ url: tlsServer.url, sslMode: 'DISABLED' }).hit(KEY_MARKER, 60_000, 1));
    expect(plain.code).toBe('ERR_AUTH');
  });
});
