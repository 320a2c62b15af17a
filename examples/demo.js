'use strict';
// ratestore in one command: a rate-limited route on loopback, backed by
// memoryStore(), and a client that runs into its limit and waits it out.

const http = require('node:http');
const { createLimiter, memoryStore } = require('..');

const limiter = createLimiter({ store: memoryStore(), limit: 5, windowMs: 3_000 });

const server = http.createServer(async (req, res) => {
  try {
    const answer = await limiter.check(`ip:${req.socket.remoteAddress}`);
    res.writeHead(answer.allowed ? 200 : 429, { 'content-type': 'text/plain', ...answer.headers });
    res.end(answer.allowed ? 'hello\n' : 'slow down\n');
  } catch {
    // A failing store refuses the request: it never switches the limit off.
    res.writeHead(500).end('rate limiter unavailable\n');
  }
});

async function request(port, n) {
  const response = await fetch(`http://127.0.0.1:${port}/api/hello`);
  const header = (name) => response.headers.get(name) ?? '-';
  console.log(
    `#${String(n).padStart(2)}  ${response.status}  ` +
      `RateLimit-Limit=${header('ratelimit-limit')}  RateLimit-Remaining=${header('ratelimit-remaining')}  ` +
      `RateLimit-Reset=${header('ratelimit-reset')}s  Retry-After=${header('retry-after')}`,
  );
  return response;
}

server.listen(0, '127.0.0.1', async () => {
  const { port } = server.address();
  console.log(`Rate-limited route on http://127.0.0.1:${port}/api/hello: 5 requests per 3 s, memoryStore()\n`);
  let n = 0;
  let retryAfter = 1;
  for (let i = 0; i < 7; i++) {
    const response = await request(port, ++n);
    if (response.status === 429) retryAfter = Number(response.headers.get('retry-after'));
  }
  console.log(`\nRefused: waiting the ${retryAfter} s that Retry-After asked for...\n`);
  await new Promise((resolve) => setTimeout(resolve, retryAfter * 1000));
  await request(port, ++n);
  server.close();
});
