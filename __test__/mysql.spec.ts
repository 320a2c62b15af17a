import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll } from 'vitest';
import { mysqlStore, type MysqlStoreOptions } from '../index.js';
import { rateLimitStoreContract } from './contract.js';
import { expressSuite } from './express-suite.js';
import { limiterSuite } from './limiter-suite.js';
import { operationsSuite } from './operations-suite.js';
import { universalSuite } from './universal-suite.js';
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
limiterSuite('mysqlStore', () => make());
operationsSuite('mysqlStore', () => make());
// The adapters' suites count on fixed keys (the client's address) in each test: a table per store.
const isolated = () => make({ table: `adapter_${randomUUID().replace(/-/g, '').slice(0, 20)}` });
universalSuite('mysqlStore', isolated);
expressSuite('mysqlStore', isolated);
