import { defineConfig } from 'vitest/config';

// The end-to-end suites: real npm installs and real Next.js builds, one file at a time.
export default defineConfig({
  test: {
    include: ['e2e/**/*.e2e.ts'],
    fileParallelism: false,
    testTimeout: 60_000,
    hookTimeout: 300_000,
  },
});
