// Several limits as one step on the stores that run it in the store itself: memoryStore (one critical
// section) and sqliteStore (one transaction of its thread). postgresStore's and mysqlStore's runs are
// in their own suites, beside the servers they start.
import { randomUUID } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll } from 'vitest';
import { memoryStore, sqliteStore } from '../index.js';
import { atomicSuite } from './atomic-suite.js';

const dir = mkdtempSync(join(tmpdir(), 'ratestore-atomic-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
const file = join(dir, `${randomUUID()}.sqlite3`);

atomicSuite('memoryStore', () => memoryStore());
atomicSuite(
  'sqliteStore',
  () => sqliteStore({ path: file, timeoutMs: 5_000 }),
  () => sqliteStore({ path: file, timeoutMs: 5_000 }),
);
atomicSuite("sqliteStore(':memory:')", () => sqliteStore({ path: ':memory:' }));
