'use strict';
// How the benchmark starts a process of its own (a child scenario, a CPU store process) on the runtime
// it runs on: Node.js and Bun take a script and flags alike; Deno runs one with `run`, the permissions a
// Node.js program has, npm's node_modules, and V8 flags passed through.

const { runtime, runtimeLabel } = require('../lib/runtime.js');

/** `[command, args]` that run `script` with `args` on this runtime; `gc`: with global.gc exposed. */
function self(script, args, { gc = false } = {}) {
  if (runtime.name === 'Deno') {
    const flags = ['run', '--allow-all', '--node-modules-dir=manual', ...(gc ? ['--v8-flags=--expose-gc'] : [])];
    return [process.execPath, [...flags, script, ...args]];
  }
  return [process.execPath, [...(gc ? ['--expose-gc'] : []), script, ...args]];
}

/** What RESULTS.md and the console say ran the benchmark: "Node.js v24.22.3", "Bun 1.4.5". */
function runtimeName() {
  return runtime.name === 'Node.js' ? `Node.js ${process.version}` : runtimeLabel();
}

module.exports = { self, runtime, runtimeName };
