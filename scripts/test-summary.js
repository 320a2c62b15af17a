'use strict';
// Reads a test log from stdin (cargo test, Vitest, test:valgrind, runtime suite and test:linux output) and prints one
// closing line with the totals: "N passed, N failed".

let log = '';
process.stdin.on('data', (chunk) => (log += chunk));
process.stdin.on('end', () => {
  // eslint-disable-next-line no-control-regex
  const text = log.replace(/\x1b\[[0-9;]*m/g, '');
  let passed = 0;
  let failed = 0;
  for (const [, p, f] of text.matchAll(/test result: \w+\. (\d+) passed; (\d+) failed/g)) {
    passed += Number(p);
    failed += Number(f);
  }
  for (const [, summary] of text.matchAll(/^\s*Tests\s+(.*)$/gm)) {
    passed += Number(/(\d+) passed/.exec(summary)?.[1] ?? 0);
    failed += Number(/(\d+) failed/.exec(summary)?.[1] ?? 0);
  }
  for (const [, p, f] of text.matchAll(/^test:valgrind: (\d+) passed, (\d+) failed$/gm)) {
    passed += Number(p);
    failed += Number(f);
  }
  for (const [, p, f] of text.matchAll(/^test:linux: (\d+) passed, (\d+) failed$/gm)) {
    passed += Number(p);
    failed += Number(f);
  }
  for (const [, p, m] of text.matchAll(/^runtime suite: (\d+) of (\d+) runtimes passed$/gm)) {
    passed += Number(p);
    failed += Number(m) - Number(p);
  }
  console.log(`${passed} passed, ${failed} failed`);
});
