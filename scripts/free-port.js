'use strict';
// A port nothing listens on, on 127.0.0.1: for the servers the tests and the benchmark start.

const { createServer } = require('node:net');

function freePort() {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

module.exports = { freePort };
