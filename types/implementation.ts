// The JavaScript the package runs, checked against what index.d.ts declares (`npm run lint`, with
// tsconfig.impl.json): each export, its type inferred from lib/'s code and JSDoc (lib/ has no
// declaration files, so nothing here is read from index.d.ts), must be assignable to its
// declaration, so a store whose methods or results drift from the declared ones fails the check.
import type * as Declared from '../index.d.ts';
import { memoryStore } from '../lib/memory.js';
import { redisStore } from '../lib/redis.js';
import { postgresStore } from '../lib/postgres.js';
import { sqliteStore } from '../lib/sqlite.js';
import { mysqlStore } from '../lib/mysql.js';
import { createLimiter } from '../lib/limiter/index.js';
import { clientIp } from '../lib/client-ip.js';
import { universalStore, expressStore } from '../lib/adapters.js';
import { metricsText } from '../lib/stats.js';
import { isRatestoreError } from '../lib/check.js';

export const checked: {
  memoryStore: typeof Declared.memoryStore;
  redisStore: typeof Declared.redisStore;
  postgresStore: typeof Declared.postgresStore;
  sqliteStore: typeof Declared.sqliteStore;
  mysqlStore: typeof Declared.mysqlStore;
  createLimiter: typeof Declared.createLimiter;
  clientIp: typeof Declared.clientIp;
  universalStore: typeof Declared.universalStore;
  expressStore: typeof Declared.expressStore;
  metricsText: typeof Declared.metricsText;
  isRatestoreError: typeof Declared.isRatestoreError;
} = {
  memoryStore,
  redisStore,
  postgresStore,
  sqliteStore,
  mysqlStore,
  createLimiter,
  clientIp,
  universalStore,
  expressStore,
  metricsText,
  isRatestoreError,
};
