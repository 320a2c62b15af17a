import { defineConfig } from 'vitest/config';

// Most suites spend their time waiting on the servers they start and on timers, not on the CPU, so
// three files run at once (Vitest's default on 2 cores would be one at a time), each in a process
// of its own with its own servers on free ports.
const SHARED_WORKERS = 3;

// Suites that use the CPU much and check no real-time bound: `npm test` (scripts/test.js) runs them
// beside the end-to-end suites at a lower CPU priority than the shared suites, some of whose tests
// check real-time bounds.
const BACKGROUND = [
  // Checks every store against the model: the model's search of the states a call's slack allows keeps
  // a core busy, and the slack is measured, so a slower machine widens it instead of failing.
  '__test__/differential.spec.ts',
];

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
        test: {
          name: 'shared',
          include: ['__test__/**/*.spec.ts'],
          exclude: [...BACKGROUND, ...ALONE],
          maxWorkers: SHARED_WORKERS,
        },
      },
      { extends: true, test: { name: 'background', include: BACKGROUND, maxWorkers: 1 } },
      { extends: true, test: { name: 'alone', include: ALONE, maxWorkers: 1 } },
    ],
  },
});
