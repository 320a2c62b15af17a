'use strict';
// Which JavaScript runtime runs this process. Bun and Deno run Node.js code and load Node-API
// addons, but their libuv is not Node's: Bun's uv_poll_* are stubs that abort the process, and
// Deno's poll reports one event then stops. So only real Node.js gets redisStore's event-loop
// transport; every other runtime gets the I/O thread, which needs nothing of the host but Node-API.

/** `{ name, version, eventLoop }` for the runtime described by `proc` and `global`. */
function detectRuntime(proc, global) {
  const versions = (proc && proc.versions) || {};
  if (typeof versions.bun === 'string' || global.Bun !== undefined) {
    return { name: 'Bun', version: versions.bun || String(global.Bun && global.Bun.version), eventLoop: false };
  }
  if (typeof versions.deno === 'string' || global.Deno !== undefined) {
    const deno = versions.deno || (global.Deno && global.Deno.version && global.Deno.version.deno);
    return { name: 'Deno', version: String(deno), eventLoop: false };
  }
  if (typeof versions.node === 'string' && typeof versions.uv === 'string') {
    return { name: 'Node.js', version: versions.node, eventLoop: true };
  }
  // Something else that loads Node-API addons: nothing of its event loop is assumed.
  return { name: 'an unknown JavaScript runtime', version: String(versions.node), eventLoop: false };
}

const runtime = detectRuntime(typeof process === 'object' ? process : undefined, globalThis);

/** "Bun 1.4.5", "Node.js 24.22.3": for messages. */
function runtimeLabel(r = runtime) {
  return `${r.name} ${r.version}`;
}

module.exports = { runtime, detectRuntime, runtimeLabel };
