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
    for (const socket of [client, upstream]) socket.on('error', () => [client, upstream].forEach((s) => s.destroy()));
    client.on('close', () => upstream.destroy());
    sockets.push(client, upstream);
  });
  await new Promise<void>((resolve) => proxy.listen(0, '127.0.0.1', resolve));
  cleanups.push(
    () =>
      new Promise<void>((resolve) => {
        for (const socket of sockets) socket.destroy();
        proxy.close(() => resolve());
      }),
  );
  return {
    port: (proxy.address() as { port: number }).port,
    slow: () => (slowing = true),
    connections: () => accepted,
  };
}
