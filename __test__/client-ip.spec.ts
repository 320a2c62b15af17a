// clientIp over the two request shapes apps have: Node's IncomingMessage (from a real server on
// loopback) and a Fetch Request or Headers (as Next.js passes them).
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { clientIp } from '../index.js';

let server: Server;
let base: string;

beforeAll(async () => {
  // Answers what clientIp makes of the request, for ?proxies=N trusted proxies.
  server = createServer((request, response) => {
    const trustedProxies = Number(new URL(request.url!, 'http://x').searchParams.get('proxies'));
    response.end(JSON.stringify(clientIp(request, { trustedProxies }) ?? null));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

afterAll(() => new Promise<void>((resolve) => server.close(() => resolve())));

async function seen(proxies: number, forwarded?: string): Promise<string | null> {
  const headers: Record<string, string> = forwarded === undefined ? {} : { 'x-forwarded-for': forwarded };
  return (await fetch(`${base}/?proxies=${proxies}`, { headers })).json();
}

const fetchRequest = (forwarded?: string) =>
  new Request('http://app.test/api', forwarded === undefined ? {} : { headers: { 'x-forwarded-for': forwarded } });

describe('clientIp on an http.IncomingMessage', () => {
  it('answers the socket peer with no trusted proxy, whatever the client sends', async () => {
    expect(await seen(0)).toBe('127.0.0.1');
    expect(await seen(0, '198.51.100.7')).toBe('127.0.0.1');
  });

  it('answers the entry the trusted proxies wrote, counted from the right', async () => {
    // One proxy: it appended the client's address last; what the client sent sits to its left.
    expect(await seen(1, '198.51.100.7')).toBe('198.51.100.7');
    expect(await seen(1, '203.0.113.66, 198.51.100.7')).toBe('198.51.100.7');
    // Two proxies: the outer one wrote the client's address, the inner one the outer proxy's.
    expect(await seen(2, '203.0.113.66, 198.51.100.7, 10.0.0.2')).toBe('198.51.100.7');
    // Fewer entries than proxies: every entry came from a trusted proxy; the furthest is the client.
    expect(await seen(3, '198.51.100.7, 10.0.0.2')).toBe('198.51.100.7');
    // A proxy in front but no header: the peer.
    expect(await seen(1)).toBe('127.0.0.1');
  });
});

describe('clientIp on a Fetch Request or Headers', () => {
  it('has no socket, so it trusts only what the proxies wrote', () => {
    expect(clientIp(fetchRequest('198.51.100.7'))).toBeUndefined();
    expect(clientIp(fetchRequest('203.0.113.66, 198.51.100.7'), { trustedProxies: 1 })).toBe('198.51.100.7');
    expect(clientIp(fetchRequest('203.0.113.66,198.51.100.7 , 10.0.0.2'), { trustedProxies: 2 })).toBe('198.51.100.7');
    expect(clientIp(fetchRequest(), { trustedProxies: 1 })).toBeUndefined();
    expect(clientIp(new Headers({ 'x-forwarded-for': '198.51.100.7' }), { trustedProxies: 1 })).toBe('198.51.100.7');
  });

  it('strips ports and IPv4-mapped prefixes, and refuses what is not an address', () => {
    const ip = (forwarded: string) => clientIp(fetchRequest(forwarded), { trustedProxies: 1 });
    expect(ip('198.51.100.7:5123')).toBe('198.51.100.7');
    expect(ip('[2001:DB8::1]:443')).toBe('2001:db8::1');
    expect(ip('2001:db8::1')).toBe('2001:db8::1');
    expect(ip('::ffff:198.51.100.7')).toBe('198.51.100.7');
    expect(ip('unknown')).toBeUndefined();
    expect(ip('')).toBeUndefined();
  });

  it('checks its arguments', () => {
    const call = clientIp as (request: unknown, options?: unknown) => unknown;
    expect(() => call({})).toThrow(TypeError);
    expect(() => call(fetchRequest(), { trustedProxies: -1 })).toThrow(RangeError);
    expect(() => call(fetchRequest(), { trustedProxies: '1' })).toThrow(TypeError);
    expect(() => call(fetchRequest(), { proxies: 1 })).toThrow(/unknown option "proxies"/);
  });
});
