// universalStore and expressStore over redisStore on a real Redis Cluster (three masters with a
// replica each): the adapters' suites, on one cluster started for them.
import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll } from 'vitest';
import { redisStore, type RedisStore } from '../index.js';
import { expressSuite } from './express-suite.js';
import { startCluster, type Cluster } from './support/cluster.js';
import { universalSuite } from './universal-suite.js';

let cluster: Cluster;
beforeAll(async () => {
  cluster = await startCluster();
});
afterAll(() => cluster?.stop());

const stores: RedisStore[] = [];
afterAll(() => Promise.all(stores.splice(0).map((store) => store.close())));
const make = () => {
  const store = redisStore({ url: cluster.url, cluster: true, prefix: `test:${randomUUID()}:`, timeoutMs: 5_000 });
  stores.push(store);
  return store;
};

universalSuite('redisStore on a cluster', make);
expressSuite('redisStore on a cluster', make);
