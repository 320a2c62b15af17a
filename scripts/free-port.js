'use strict';
// A port nothing listens on, on 127.0.0.1: for the servers the tests and the benchmark start.
//
// Several test files run at once, each starting servers on the ports this answers. A port the kernel
// hands out for bind(0) comes from the ephemeral range, where every outgoing connection also takes its
// local port, and the kernel may hand a port just closed to the next caller: between this answer and the
// server's bind, another process could take it. So the port is picked at random below the ephemeral
// range (Linux: /proc/sys/net/ipv4/ip_local_port_range, 32768-60999 by default), where no connection
// takes one, and checked free by listening on it; where that range leaves no room, the kernel picks.

const { readFileSync } = require('node:fs');
const { createServer } = require('node:net');

/** The ports picked from: [first, end), below the ephemeral range; undefined where there is no room. */
function range() {
  let ephemeral = 32768;
  try {
    ephemeral = Number(readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/)[0]);
  } catch {
    // not Linux: IANA's dynamic range starts at 49152, above this one
  }
  const first = 16384;
  return ephemeral - first >= 4096 ? [first, Math.min(ephemeral, 32768)] : undefined;
}

/** Listens on `port` (0: the kernel picks) and closes: the port, or undefined when it is taken. */
function probe(port) {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once('error', (error) => (error.code === 'EADDRINUSE' ? resolve(undefined) : reject(error)));
    server.listen(port, '127.0.0.1', () => {
      const { port: bound } = server.address();
      server.close(() => resolve(bound));
    });
  });
}

async function freePort() {
  const ports = range();
  if (ports) {
    const [first, end] = ports;
    for (let i = 0; i < 50; i++) {
      const port = await probe(first + Math.floor(Math.random() * (end - first)));
      if (port !== undefined) return port;
    }
  }
  return probe(0);
}

/**
 * `start()` (a server started on ports from freePort), again when one of its servers lost its port to
 * another process between the probe and its bind ("Address already in use": the suites start their
 * servers at once), up to `tries` times; any other failure at once.
 */
async function retryPortTaken(start, tries = 3) {
  for (let attempt = 1; ; attempt++) {
    try {
      return await start();
    } catch (error) {
      if (attempt >= tries || !/Address already in use/.test(String(error?.message))) throw error;
    }
  }
}

module.exports = { freePort, retryPortTaken };
