// A TCP proxy for the fault tests: a real server behind it, some of whose replies come late.
import { createServer, connect, type Server, type Socket } from 'node:net';

/** Where the RESP value at `at` in `buf` ends, or -1 if it is not all there yet. */
function respEnd(buf: Buffer, at: number): number {
  const line = buf.indexOf('\r\n', at);
  if (line < 0) return -1;
  const type = String.fromCharCode(buf[at]);
  const n = Number(buf.toString('latin1', at + 1, line));
  if (type === '$') return n < 0 ? line + 2 : line + 2 + n + 2 <= buf.length ? line + 2 + n + 2 : -1;
  if (type === '*') {
    let end = line + 2;
    for (let i = 0; i < n; i++) {
      end = respEnd(buf, end);
      if (end < 0) return -1;
    }
    return end;
  }
  return line + 2;
}

/** A proxied connection's two sockets end together, and are kept in `sockets` for the cleanup. */
function joined(client: Socket, upstream: Socket, sockets: Socket[]): void {
  for (const socket of [client, upstream]) socket.on('error', () => [client, upstream].forEach((s) => s.destroy()));
  client.on('close', () => upstream.destroy());
  sockets.push(client, upstream);
}

/**
 * Listens on a free loopback port (answered); the cleanup destroys `sockets` (the server's, as it
 * keeps them) and closes the server.
 */
export async function listenOnLoopback(
  server: Server,
  sockets: Socket[],
  cleanups: (() => unknown)[],
): Promise<number> {
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  cleanups.push(
    () =>
      new Promise<void>((resolve) => {
        for (const socket of sockets) socket.destroy();
        server.close(() => resolve());
      }),
  );
  return (server.address() as { port: number }).port;
}

/**
 * A loopback TCP proxy that hands on each reply `delay(key)` ms after its command came (the key of an
 * EVAL/EVALSHA), in order, as a server whose script runs slowly on some keys would; once `slow()`
 * is on. Counts the connections it accepts.
 */
export async function slowingProxy(
  target: number,
  delay: (key: string) => number,
  cleanups: (() => unknown)[],
): Promise<{ port: number; slow(): void; connections(): number }> {
  const sockets: Socket[] = [];
  let slowing = false;
  let accepted = 0;
  const proxy: Server = createServer((client) => {
    accepted++;
    const upstream = connect(target, '127.0.0.1');
    let asked = Buffer.alloc(0);
    let answered = Buffer.alloc(0);
    // When each command's reply may go, in order.
    const due: number[] = [];
    let last = 0;
    client.on('data', (chunk: Buffer) => {
      upstream.write(chunk);
      asked = Buffer.concat([asked, chunk]);
      for (let end = respEnd(asked, 0); end > 0; end = respEnd(asked, 0)) {
        const parts = asked.toString('latin1', 0, end).split('\r\n');
        // *n, $len, word, $len, sha, $len, numkeys, $len, key
        const key = parts[8] ?? '';
        due.push(Date.now() + (slowing ? delay(key) : 0));
        asked = asked.subarray(end);
      }
    });
    upstream.on('data', (chunk: Buffer) => {
      answered = Buffer.concat([answered, chunk]);
      for (let end = respEnd(answered, 0); end > 0; end = respEnd(answered, 0)) {
        const reply = answered.subarray(0, end);
        answered = answered.subarray(end);
        const at = Math.max(due.shift() ?? 0, last);
        last = at;
        setTimeout(() => client.destroyed || client.write(reply), Math.max(0, at - Date.now()));
      }
    });
    joined(client, upstream, sockets);
  });
  const port = await listenOnLoopback(proxy, sockets, cleanups);
  return {
    port,
    slow: () => (slowing = true),
    connections: () => accepted,
  };
}

/** The bulk strings of the RESP command that ends at `end` in `buf` (a client's commands are arrays of them). */
function respWords(buf: Buffer, end: number): Buffer[] {
  const words: Buffer[] = [];
  let at = buf.indexOf('\r\n', 0) + 2;
  while (at < end) {
    const line = buf.indexOf('\r\n', at);
    const n = Number(buf.toString('latin1', at + 1, line));
    words.push(buf.subarray(line + 2, line + 2 + n));
    at = line + 2 + n + 2;
  }
  return words;
}

/**
 * A loopback TCP proxy that, once `between(run)` is armed, lets the next EVALSHA through alone, waits
 * for its reply, awaits `run()` (another client's command, say), and only then hands on what the client
 * wrote behind that EVALSHA (how many EVALSHAs, which may meet the script loaded meanwhile: what
 * `between` resolves with; an EVAL held there is a NOSCRIPT retry, which runs as it would): another client's
 * command lands between two pipelined calls, as it can when they reach the server in two reads.
 * `scripts()` are the bodies of the EVALs seen.
 */
export async function interleavingProxy(
  target: number,
  cleanups: (() => unknown)[],
): Promise<{ port: number; between(run: () => Promise<unknown>): Promise<number>; scripts(): string[] }> {
  const sockets: Socket[] = [];
  const scripts = new Set<string>();
  let armed: { run: () => Promise<unknown>; done: (held: number) => void } | undefined;
  const proxy: Server = createServer((client) => {
    const upstream = connect(target, '127.0.0.1');
    let asked = Buffer.alloc(0);
    let answered = Buffer.alloc(0);
    let replies = 0;
    let forwarded = 0;
    // Set while the bytes behind an EVALSHA wait for its reply; how many EVALSHAs are among them.
    let held: Buffer[] | undefined;
    let heldEvalshas = 0;
    let onReply: (() => void) | undefined;
    client.on('data', (chunk: Buffer) => {
      asked = Buffer.concat([asked, chunk]);
      for (let end = respEnd(asked, 0); end > 0; end = respEnd(asked, 0)) {
        const command = asked.subarray(0, end);
        asked = asked.subarray(end);
        const words = respWords(command, end);
        const verb = words[0]?.toString('latin1').toUpperCase();
        if (verb === 'EVAL') scripts.add(words[1].toString('utf8'));
        if (held) {
          held.push(command);
          if (verb === 'EVALSHA') heldEvalshas++;
          continue;
        }
        upstream.write(command);
        forwarded++;
        const step = armed;
        if (verb === 'EVALSHA' && step) {
          armed = undefined;
          held = [];
          heldEvalshas = 0;
          const wanted = forwarded;
          onReply = () => {
            if (replies < wanted) return;
            onReply = undefined;
            void step.run().then(() => {
              const rest = held ?? [];
              held = undefined;
              for (const c of rest) {
                upstream.write(c);
                forwarded++;
              }
              step.done(heldEvalshas);
            });
          };
        }
      }
    });
    upstream.on('data', (chunk: Buffer) => {
      client.write(chunk);
      answered = Buffer.concat([answered, chunk]);
      for (let end = respEnd(answered, 0); end > 0; end = respEnd(answered, 0)) {
        answered = answered.subarray(end);
        replies++;
      }
      onReply?.();
    });
    joined(client, upstream, sockets);
  });
  const port = await listenOnLoopback(proxy, sockets, cleanups);
  return {
    port,
    between: (run) => new Promise<number>((done) => (armed = { run, done })),
    scripts: () => [...scripts],
  };
}

type Hits = { hit(key: string, windowMs: number, amount: number): Promise<{ count: number }> };

/**
 * Two hits on one key made in one tick, right after SCRIPT FLUSH, with another client loading the
 * script between them (through `proxy`, in front of the server `cli` reaches): answers how the first
 * settled (a count, or its error) and the second's count. The second must reach the proxy behind the
 * first's EVALSHA for the load to land between them; where it went only once the first (and its retry)
 * had answered, a legitimate order (1 then 3), it tries again with another key, up to 20 times.
 */
export async function overtakenPair(
  store: Hits,
  proxy: Awaited<ReturnType<typeof interleavingProxy>>,
  cli: (...args: string[]) => Promise<unknown>,
  key: () => string,
): Promise<{ first: unknown; second: number; after: number }> {
  const [body] = proxy.scripts();
  if (body === undefined) throw new Error('no script went as EVAL through the proxy: warm the store first');
  for (let attempt = 0; attempt < 20; attempt++) {
    const k = key();
    await cli('SCRIPT', 'FLUSH');
    const between = proxy.between(() => cli('SCRIPT', 'LOAD', body));
    const first = store.hit(k, 60_000, 1).then(
      (r) => r.count,
      (e: unknown) => e,
    );
    const second = store.hit(k, 60_000, 2);
    const held = await between;
    const [one, two] = [await first, (await second).count];
    const after = (await store.hit(k, 60_000, 0)).count;
    if (held > 0) return { first: one, second: two, after };
    if (one !== 1 || two !== 3 || after !== 3) throw new Error(`out of order: ${String(one)}, ${two}, ${after}`);
  }
  throw new Error('the two hits never shared a pipeline in 20 tries');
}
