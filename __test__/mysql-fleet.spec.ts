// A fleet on one database: 3 processes x 40 requests in flight of askdare's pattern on shared keys, in
// every order, for a few seconds. Every call answers, and the rows' totals are exactly the sum of the
// hits the instances were told counted (none lost, none counted twice).
import { randomUUID } from 'node:crypto';
import { execFile } from 'node:child_process';
import { join } from 'node:path';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { mysqlStore } from '../index.js';
import { startMariadb, type MariadbServer } from './support/mariadb.js';

let server: MariadbServer;
beforeAll(async () => {
  server = await startMariadb();
}, 120_000);
afterAll(() => server?.stop());

interface Report {
  counted: Record<string, number>;
  errors: Record<string, number>;
  requests: number;
  slowest: number;
}

function instance(table: string, seconds: number, inFlight: number): Promise<Report> {
  const child = join(__dirname, 'fixtures', 'mysql-fleet-child.js');
  return new Promise((resolve, reject) =>
    execFile(
      process.execPath,
      [child, server.url, table, String(seconds), String(inFlight)],
      { timeout: 60_000 },
      (error, stdout, stderr) =>
        error ? reject(new Error(`${error.message}\n${stderr}`)) : resolve(JSON.parse(stdout)),
    ),
  );
}

it('3 processes x 40 in flight on shared keys: no failure, every count exact', async () => {
  const table = `fleet_${randomUUID().replace(/-/g, '').slice(0, 20)}`;
  // The tables exist before the fleet starts, so that its seconds are all hits.
  const setup = mysqlStore({ url: server.url, table });
  await setup.ping();
  await setup.close();
  const reports = await Promise.all([0, 1, 2].map(() => instance(table, 4, 40)));
  const expected: Record<string, number> = {};
  for (const r of reports) for (const [k, n] of Object.entries(r.counted)) expected[k] = (expected[k] ?? 0) + n;
  expect(reports.map((r) => r.errors)).toEqual([{}, {}, {}]);
  expect(reports.every((r) => r.requests > 0)).toBe(true);
  const rows = await server.sql(`SELECT CONVERT(k USING utf8mb4), total FROM ${table}`);
  const totals = Object.fromEntries(rows.split('\n').map((line) => [line.split('\t')[0], Number(line.split('\t')[1])]));
  expect(totals).toEqual(expected);
  const requests = reports.reduce((n, r) => n + r.requests, 0);
  expect(totals.global).toBe(requests);
  console.log(
    `mysql fleet: ${requests} requests (${requests * 4} calls) in 4 s, slowest request ${Math.max(...reports.map((r) => r.slowest))} ms`,
  );
}, 120_000);
