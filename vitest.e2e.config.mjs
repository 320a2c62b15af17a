import { defineConfig } from 'vitest/config';

// The end-to-end suites: real npm installs, real Next.js builds and the benchmark's smoke runs on Bun
// and Deno, their three files at once (each spends most of its time waiting on a build, an install or a
// server), each in a process of its own with its own servers and directories.
export default defineConfig({
  test: {
    include: ['e2e/**/*.e2e.ts'],
    maxWorkers: 3,
    testTimeout: 60_000,
    hookTimeout: 300_000,
  },
});
