import { randomUUID } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll } from 'vitest';
import { sqliteStore, type SqliteStoreOptions } from '../index.js';
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
