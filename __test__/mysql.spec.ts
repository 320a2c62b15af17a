import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll } from 'vitest';
import { mysqlStore, type MysqlStoreOptions } from '../index.js';
import { rateLimitStoreContract } from './contract.js';
import { plainMariadb } from './support/mariadb.js';

let server: Awaited<ReturnType<typeof plainMariadb>>;
beforeAll(async () => {
  server = await plainMariadb();
}, 120_000);
afterAll(() => server?.stop());

// The shared suites' stores use tables of this file's own, so that their resetAll() empties only what
// they wrote.
const table = `suites_${randomUUID().replace(/-/g, '').slice(0, 20)}`;
const make = (options: MysqlStoreOptions = {}) => mysqlStore({ url: server.url, table, timeoutMs: 5_000, ...options });

rateLimitStoreContract('mysqlStore', () => make());
