// The Redis Cluster the cluster suite runs against: plain JS in scripts/, so
// that the benchmark starts the same one.
export { startCluster, slotOf, type Cluster } from '../../scripts/redis-cluster.js';
