import { defineConfig } from 'vitest/config';

// Most suites spend their time waiting on the servers they start and on timers, not on the CPU, so
// three files run at once (Vitest's default on 2 cores would be one at a time), each in a process
// of its own with its own servers on free ports.
const SHARED_WORKERS = 3;

// Suites that cannot share the machine: they measure stalls or fill the CPU themselves. They run
// after the others, one file at a time, with nothing of this run beside them.
const ALONE = [
  // Fills a store of a million keys and counts the hits slower than 10 ms: a busy CPU is a false stall.
  '__test__/memory.spec.ts',
  // Every benchmark scenario in smoke mode: it keeps both cores busy for its whole run.
  '__test__/benchmark.spec.ts',
];

export default defineConfig({
  test: {
    testTimeout: 30_000,
    hookTimeout: 60_000,
    projects: [
      {
        extends: true,
        test: { name: 'shared', include: ['__test__/**/*.spec.ts'], exclude: ALONE, maxWorkers: SHARED_WORKERS },
      },
      { extends: true, test: { name: 'alone', include: ALONE, maxWorkers: 1 } },
    ],
  },
});
