'use strict';
// The store process of the CPU scenario: `cpu-child.js NAME PORT SOCKET`
// serves hit requests ("ID KEY\n", answered "ID\n", or "E ID\n" on an error)
// on a unix socket, each one hit of the named Redis store against the
// redis-server on PORT (or of the named in-memory store, or of the named
// PostgreSQL store with a URL in place of PORT). Prints "ready" once it listens.

const { createServer } = require('node:net');
const { memoryStores, redisStores, postgresStores, WINDOW_MS } = require('./stores.js');

async function main() {
  const [name, port, path] = process.argv.slice(2);
  const spec = [...redisStores, ...memoryStores, ...postgresStores].find((s) => s.name === name);
  if (!spec) throw new Error(`no store named ${name}`);
  const store = await spec.create(/^\d+$/.test(port) ? Number(port) : port);
  // One hit first, so that connecting and loading the script are not measured.
  await store.hit('warm', WINDOW_MS, 1);
  const server = createServer((socket) => {
    let buffer = '';
    socket.on('data', (chunk) => {
      buffer += chunk;
      const lines = buffer.split('\n');
      buffer = lines.pop();
      for (const line of lines) {
        const space = line.indexOf(' ');
        const id = line.slice(0, space);
        store.hit(line.slice(space + 1), WINDOW_MS, 1).then(
          () => socket.write(`${id}\n`),
          () => socket.write(`E ${id}\n`),
        );
      }
    });
    socket.on('error', () => {});
    socket.on('close', async () => {
      server.close();
      await store.close?.();
    });
  });
  server.listen(path, () => console.log('ready'));
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
