'use strict';
// A small REST endpoint in front of a real redis-server, written from
// Upstash's documented REST protocol, for the tests and the benchmark:
//
//   POST /           body ["CMD", "arg", …]          → 200 { "result": … }, or 400 { "error": "…" }
//   POST /pipeline   body [["CMD", …], ["CMD", …]]   → 200 [{ "result": … } | { "error": "…" }, …]
//   Authorization: Bearer <token>                    → else 401 { "error": "Unauthorized" }
//   Upstash-Encoding: base64                         → every string in a result base64-encoded
//
// Integers are written as JSON numbers with every digit Redis sent. Over TLS it
// speaks HTTP/2 (by ALPN) and HTTP/1.1. Each endpoint is a process of its own
// (`startRest` spawns this file), so a test can kill, pause and restart it, and
// a benchmark measures it apart from the clients. One connection to Redis per
// endpoint carries every command, in order, as Upstash's proxy does.
//
// GET /_endpoint/stats (no token) answers what the endpoint saw, for tests.

const { spawn } = require('node:child_process');
const { readFileSync } = require('node:fs');
const http = require('node:http');
const http2 = require('node:http2');
const { createConnection } = require('node:net');
const { freePort } = require('./free-port.js');

/** RESP replies as the endpoint keeps them: their kind and value (integers as digit strings). */
class RespReader {
  #buffer = Buffer.alloc(0);

  feed(chunk) {
    this.#buffer = this.#buffer.length === 0 ? chunk : Buffer.concat([this.#buffer, chunk]);
  }

  /** The next whole reply, or undefined until more bytes arrive. */
  next() {
    const parsed = this.#parse(0);
    if (parsed === undefined) return undefined;
    this.#buffer = this.#buffer.subarray(parsed.end);
    return parsed.reply;
  }

  #parse(at) {
    const buffer = this.#buffer;
    const eol = buffer.indexOf('\r\n', at);
    if (eol < 0) return undefined;
    const type = String.fromCharCode(buffer[at]);
    const line = buffer.toString('utf8', at + 1, eol);
    const end = eol + 2;
    switch (type) {
      case '+':
        return { reply: { kind: 'status', value: line }, end };
      case '-':
        return { reply: { kind: 'error', value: line }, end };
      case ':':
        return { reply: { kind: 'int', value: line }, end };
      case '$': {
        const length = Number(line);
        if (length < 0) return { reply: { kind: 'bulk', value: null }, end };
        if (buffer.length < end + length + 2) return undefined;
        return { reply: { kind: 'bulk', value: buffer.subarray(end, end + length) }, end: end + length + 2 };
      }
      case '*': {
        const count = Number(line);
        if (count < 0) return { reply: { kind: 'array', value: null }, end };
        const items = [];
        let next = end;
        for (let i = 0; i < count; i++) {
          const item = this.#parse(next);
          if (item === undefined) return undefined;
          items.push(item.reply);
          next = item.end;
        }
        return { reply: { kind: 'array', value: items }, end: next };
      }
      default:
        throw new Error(`redis-server answered out of protocol (${JSON.stringify(type)})`);
    }
  }
}

function encodeCommand(args) {
  const parts = [`*${args.length}\r\n`];
  for (const arg of args) parts.push(`$${Buffer.byteLength(arg)}\r\n`, arg, '\r\n');
  return parts.join('');
}

/** One connection to redis-server, replies matched to commands in order; reconnects after a failure. */
class Redis {
  #port;
  #socket;
  #waiting = [];

  constructor(port) {
    this.#port = port;
  }

  #connect() {
    const socket = createConnection({ host: '127.0.0.1', port: this.#port });
    socket.setNoDelay(true);
    const reader = new RespReader();
    socket.on('data', (chunk) => {
      reader.feed(chunk);
      for (let reply = reader.next(); reply !== undefined; reply = reader.next()) this.#waiting.shift()?.(reply);
    });
    const failed = () => {
      if (this.#socket !== socket) return;
      this.#socket = undefined;
      for (const settle of this.#waiting.splice(0)) settle({ kind: 'error', value: 'ERR the endpoint lost Redis' });
    };
    socket.on('error', failed);
    socket.on('close', failed);
    this.#socket = socket;
  }

  /** Sends the commands in one write; resolves their replies, in order. */
  send(commands) {
    if (this.#socket === undefined) this.#connect();
    const replies = commands.map(() => new Promise((resolve) => this.#waiting.push(resolve)));
    this.#socket.write(commands.map(encodeCommand).join(''));
    return Promise.all(replies);
  }
}

/** A reply as the JSON of a result: strings as UTF-8 (or base64), integers with every digit. */
function resultJson(reply, base64) {
  switch (reply.kind) {
    case 'int':
      return reply.value;
    case 'status':
    case 'error':
      return JSON.stringify(base64 ? Buffer.from(reply.value).toString('base64') : reply.value);
    case 'bulk':
      if (reply.value === null) return 'null';
      return JSON.stringify(reply.value.toString(base64 ? 'base64' : 'utf8'));
    case 'array':
      return reply.value === null ? 'null' : `[${reply.value.map((item) => resultJson(item, base64)).join(',')}]`;
  }
  throw new Error(`unknown reply kind ${reply.kind}`);
}

function itemJson(reply, base64) {
  return reply.kind === 'error'
    ? `{"error":${JSON.stringify(reply.value)}}`
    : `{"result":${resultJson(reply, base64)}}`;
}

/** A command from JSON: an array of strings (numbers and booleans taken as their text). */
function command(value) {
  if (!Array.isArray(value) || value.length === 0) return undefined;
  const args = value.map((arg) => (['string', 'number', 'boolean'].includes(typeof arg) ? String(arg) : undefined));
  return args.includes(undefined) ? undefined : args;
}

function serve({ port, redisPort, token, tls }) {
  const redis = new Redis(redisPort);
  const stats = { requests: 0, pipelines: 0, commands: 0, connections: 0, httpVersions: {} };
  const answer = (res, status, body) => {
    res.writeHead(status, { 'content-type': 'application/json' });
    res.end(body);
  };
  const handle = (req, res) => {
    if (req.method === 'GET' && req.url === '/_endpoint/stats') return answer(res, 200, JSON.stringify(stats));
    const chunks = [];
    req.on('data', (chunk) => chunks.push(chunk));
    req.on('end', async () => {
      stats.requests++;
      stats.httpVersions[req.httpVersion] = (stats.httpVersions[req.httpVersion] ?? 0) + 1;
      if (req.headers.authorization !== `Bearer ${token}`) return answer(res, 401, '{"error":"Unauthorized"}');
      if (req.method !== 'POST') return answer(res, 405, '{"error":"ERR only POST is served"}');
      const base64 = String(req.headers['upstash-encoding']).toLowerCase() === 'base64';
      let body;
      try {
        body = JSON.parse(Buffer.concat(chunks).toString('utf8'));
      } catch {
        return answer(res, 400, '{"error":"ERR failed to parse the request body"}');
      }
      const path = req.url.split('?')[0].replace(/\/+$/, '');
      if (path === '/pipeline') {
        const commands = Array.isArray(body) ? body.map(command) : [];
        if (commands.length === 0 || commands.includes(undefined)) {
          return answer(res, 400, '{"error":"ERR a pipeline is an array of commands"}');
        }
        stats.pipelines++;
        stats.commands += commands.length;
        const replies = await redis.send(commands);
        return answer(res, 200, `[${replies.map((reply) => itemJson(reply, base64)).join(',')}]`);
      }
      if (path === '') {
        const args = command(body);
        if (args === undefined) return answer(res, 400, '{"error":"ERR a command is an array of strings"}');
        stats.commands++;
        const [reply] = await redis.send([args]);
        return answer(res, reply.kind === 'error' ? 400 : 200, itemJson(reply, base64));
      }
      return answer(res, 404, '{"error":"ERR no such endpoint"}');
    });
  };
  const server = tls
    ? http2.createSecureServer({ cert: readFileSync(tls.cert), key: readFileSync(tls.key), allowHTTP1: true }, handle)
    : http.createServer(handle);
  server.on(tls ? 'secureConnection' : 'connection', () => stats.connections++);
  server.listen(port, '127.0.0.1', () => console.log(`listening on ${server.address().port}`));
}

const running = new Set();
process.on('exit', () => {
  for (const child of running) child.kill('SIGKILL');
});

function launch(settings) {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [__filename, JSON.stringify(settings)], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let output = '';
    const timer = setTimeout(() => fail(new Error(`the REST endpoint did not start:\n${output}`)), 10_000);
    function fail(error) {
      clearTimeout(timer);
      child.kill('SIGKILL');
      reject(error);
    }
    child.once('exit', (code) => fail(new Error(`the REST endpoint exited (${code}):\n${output}`)));
    child.stderr.on('data', (chunk) => (output += chunk));
    child.stdout.on('data', (chunk) => {
      output += chunk;
      if (output.includes('listening on')) {
        clearTimeout(timer);
        child.removeAllListeners('exit');
        child.stdout.removeAllListeners('data');
        child.stdout.resume();
        running.add(child);
        child.once('exit', () => running.delete(child));
        resolve(child);
      }
    });
  });
}

/**
 * Sends `signal` to the endpoint's process through process.kill, not child.kill: Deno's child.kill
 * takes the first signal sent (a SIGCONT too) for the child's end, and sends none after it.
 */
function send(child, signal) {
  try {
    process.kill(child.pid, signal);
  } catch (error) {
    if (error.code !== 'ESRCH') throw error; // it has already ended
  }
}

function exited(child) {
  return child.exitCode !== null || child.signalCode !== null
    ? Promise.resolve()
    : new Promise((resolve) => child.once('exit', () => resolve()));
}

/** Starts an endpoint in front of the redis-server on `redisPort`; see rest-endpoint.d.ts. */
async function startRest({ redisPort, token, tls }) {
  const port = await freePort();
  const settings = { port, redisPort, token, tls };
  let child = await launch(settings);
  const url = `${tls ? 'https' : 'http'}://127.0.0.1:${port}`;
  return {
    url,
    token,
    port,
    get pid() {
      return child.pid;
    },
    signal(signal) {
      send(child, signal);
    },
    exited: () => exited(child),
    async restart() {
      await exited(child);
      child = await launch(settings);
    },
    async stats() {
      if (!tls) return (await fetch(`${url}/_endpoint/stats`)).json();
      // Over TLS, trusting the test CA, which fetch does not.
      return new Promise((resolve, reject) => {
        require('node:https')
          .get(`${url}/_endpoint/stats`, { ca: readFileSync(tls.ca) }, (res) => {
            let text = '';
            res.on('data', (chunk) => (text += chunk));
            res.on('end', () => resolve(JSON.parse(text)));
          })
          .on('error', reject);
      });
    },
    async stop() {
      send(child, 'SIGCONT');
      send(child, 'SIGKILL');
      await exited(child);
    },
  };
}

if (require.main === module) serve(JSON.parse(process.argv[2]));

module.exports = { startRest };
