// Runs a store in several worker threads at once: every worker hits one key.
import { join } from 'node:path';
import { Worker } from 'node:worker_threads';

export interface WorkerHits {
  factory: 'memoryStore' | 'redisStore';
  options: object;
  key: string;
  hits: number;
}

/** Every count each of `workers` threads saw, all together and sorted. */
export async function hitFromWorkers(workers: number, job: WorkerHits): Promise<number[]> {
  const runs = Array.from({ length: workers }, () => {
    const worker = new Worker(join(__dirname, '..', 'fixtures', 'store-worker.js'), { workerData: job });
    return new Promise<number[]>((resolve, reject) => {
      worker.once('message', resolve);
      worker.once('error', reject);
    }).finally(() => worker.terminate());
  });
  return (await Promise.all(runs)).flat().sort((x, y) => x - y);
}
