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
    expect(ip('[2001:DB8::1]:443')).toBe('2001:db8::/56');
    expect(clientIp(fetchRequest('[2001:DB8::1]:443'), { trustedProxies: 1, ipv6Subnet: false })).toBe('2001:db8::1');
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
    expect(() => call(fetchRequest(), { ipv6Subnet: 0 })).toThrow(RangeError);
    expect(() => call(fetchRequest(), { ipv6Subnet: 129 })).toThrow(RangeError);
    expect(() => call(fetchRequest(), { ipv6Subnet: '56' })).toThrow(TypeError);
    expect(() => call(fetchRequest(), { platform: 'heroku' })).toThrow(/platform must be one of vercel, cloudflare/);
    expect(() => call(fetchRequest(), { header: 'x-client-ip' })).toThrow(RangeError);
    expect(() => call(fetchRequest(), { platform: 'fly', header: 'x-real-ip' })).toThrow(TypeError);
    expect(() => call(fetchRequest(), { trustedProxyRanges: ['10.0.0.0/33'] })).toThrow(RangeError);
    expect(() => call(fetchRequest(), { trustedProxyRanges: ['nope'] })).toThrow(RangeError);
    expect(() => call(fetchRequest(), { trustedProxyRanges: '10.0.0.0/8' })).toThrow(TypeError);
    expect(() => call(fetchRequest(), { trustedProxyRanges: ['10.0.0.0/8'], trustedProxies: 1 })).toThrow(TypeError);
  });
});

describe('clientIp and IPv6 clients', () => {
  const ip = (forwarded: string, options: Parameters<typeof clientIp>[1] = {}) =>
    clientIp(fetchRequest(forwarded), { trustedProxies: 1, ...options });

  it("answers an IPv6 client's /56 by default, another prefix or the whole address on request", () => {
    expect(ip('2001:db8:abcd:12ff:1:2:3:4')).toBe('2001:db8:abcd:1200::/56');
    expect(ip('2001:db8:abcd:12ff:1:2:3:4', { ipv6Subnet: 64 })).toBe('2001:db8:abcd:12ff::/64');
    expect(ip('2001:db8:abcd:12ff:1:2:3:4', { ipv6Subnet: 48 })).toBe('2001:db8:abcd::/48');
    expect(ip('2001:DB8:ABCD:12FF:0:0:0:4', { ipv6Subnet: false })).toBe('2001:db8:abcd:12ff::4');
    expect(ip('2001:db8::1', { ipv6Subnet: 128 })).toBe('2001:db8::1/128');
    // IPv4 is never grouped.
    expect(ip('198.51.100.7', { ipv6Subnet: 8 })).toBe('198.51.100.7');
  });

  it('answers the IPv4 address an IPv4-mapped or dotted IPv4-compatible address holds', () => {
    for (const written of [
      '::ffff:198.51.100.7',
      '::FFFF:c633:6407',
      '0:0:0:0:0:ffff:198.51.100.7',
      '[::ffff:198.51.100.7]:80',
      '::198.51.100.7',
    ]) {
      expect(ip(written)).toBe('198.51.100.7');
    }
    // No IPv4 address in these: :: and ::1 are IPv6's own.
    expect(ip('::1', { ipv6Subnet: false })).toBe('::1');
    expect(ip('::1')).toBe('::/56');
  });

  it('answers the IPv4 client a NAT64, 6to4 or Teredo address carries, whatever the prefix asked', () => {
    for (const subnet of [56, 64, false] as const) {
      // NAT64's well-known prefix: the IPv4 address in the last 32 bits.
      expect(ip('64:ff9b::c633:6407', { ipv6Subnet: subnet })).toBe('198.51.100.7');
      expect(ip('64:ff9b::198.51.100.7', { ipv6Subnet: subnet })).toBe('198.51.100.7');
      // 6to4: every /56 of the site's /48 is one client, its IPv4 address.
      expect(ip('2002:c633:6407:1::1', { ipv6Subnet: subnet })).toBe('198.51.100.7');
      expect(ip('2002:c633:6407:ff00:1:2:3:4', { ipv6Subnet: subnet })).toBe('198.51.100.7');
      // Teredo (RFC 4380): the client's address inverted in the last 32 bits, whatever server and port.
      expect(ip('2001:0:4136:e378:8000:63bf:39cc:9bf8', { ipv6Subnet: subnet })).toBe('198.51.100.7');
      expect(ip('2001:0:4136:e378:8000:1234:39cc:9bf8', { ipv6Subnet: subnet })).toBe('198.51.100.7');
    }
    // Other addresses near those prefixes are IPv6's own.
    expect(ip('64:ff9b:1::1')).toBe('64:ff9b:1::/56');
    expect(ip('2001:db8::1')).toBe('2001:db8::/56');
  });

  it('answers what express-rate-limit 8 keys an address by (its ipKeyGenerator), for every prefix it takes', async () => {
    const { ipKeyGenerator } = await import('express-rate-limit');
    const addresses = [
      '2001:db8::1',
      '2001:db8:abcd:12ff::1',
      '2001:0db8:0000:0000:0001:0000:0000:0001',
      '1:2:3:4:5:6:7:8',
      'fe80::1',
      '::ffff:1.2.3.4',
      '::ffff:102:304',
      '::1.2.3.4',
      '::1',
      '2001:db8:abcd:ffff:ffff:ffff:ffff:ffff',
    ];
    for (const address of addresses) {
      for (const subnet of [32, 48, 56, 60, 64]) {
        expect(ip(address, { ipv6Subnet: subnet })).toBe(ipKeyGenerator(address, subnet));
      }
    }
  });

  it('1,000 addresses from one /56 share one limit; two /56s do not', async () => {
    const { createLimiter, memoryStore } = await import('../index.js');
    const limiter = createLimiter({ store: memoryStore(), limit: 100, windowMs: 60_000 });
    const from = (prefix: string, i: number) =>
      `${prefix}${(i % 256).toString(16)}:${((i * 7919) & 0xffff).toString(16)}:${i.toString(16)}:1:${((i * 31) & 0xffff).toString(16)}`;
    let allowed = 0;
    for (let i = 0; i < 1_000; i++) {
      // One /56 (2001:db8:aa00::/56): the fourth group's last byte and the interface id vary.
      const key = ip(from('2001:db8:aa00:', i))!;
      expect(key).toBe('2001:db8:aa00::/56');
      if ((await limiter.check(key)).allowed) allowed++;
    }
    expect(allowed).toBe(100);
    // The next /56 has a limit of its own.
    const other = ip('2001:db8:aa01::1')!;
    expect(other).toBe('2001:db8:aa01::/56');
    expect((await limiter.check(other)).allowed).toBe(true);
  });
});

describe('clientIp behind a platform or RFC 7239 proxies', () => {
  const headers = (entries: Record<string, string>) => new Headers(entries);

  it("reads a platform's header only when the app names the platform or the header", () => {
    const all = headers({
      'x-vercel-forwarded-for': '198.51.100.1',
      'cf-connecting-ip': '198.51.100.2',
      'fly-client-ip': '198.51.100.3',
      'fastly-client-ip': '198.51.100.4',
      'true-client-ip': '198.51.100.5',
      'x-real-ip': '198.51.100.6',
    });
    expect(clientIp(all)).toBeUndefined();
    expect(clientIp(all, { platform: 'vercel' })).toBe('198.51.100.1');
    expect(clientIp(all, { platform: 'cloudflare' })).toBe('198.51.100.2');
    expect(clientIp(all, { platform: 'fly' })).toBe('198.51.100.3');
    expect(clientIp(all, { platform: 'fastly' })).toBe('198.51.100.4');
    expect(clientIp(all, { platform: 'akamai' })).toBe('198.51.100.5');
    expect(clientIp(all, { header: 'true-client-ip' })).toBe('198.51.100.5');
    expect(clientIp(all, { header: 'X-Real-IP' as 'x-real-ip' })).toBe('198.51.100.6');
    expect(clientIp(headers({ 'cf-connecting-ip': '2001:db8:abcd:12ff::9' }), { platform: 'cloudflare' })).toBe(
      '2001:db8:abcd:1200::/56',
    );
    expect(clientIp(headers({ 'cf-connecting-ip': 'garbage' }), { platform: 'cloudflare' })).toBeUndefined();
    expect(clientIp(headers({}), { platform: 'cloudflare' })).toBeUndefined();
  });

  it('reads RFC 7239 Forwarded as x-forwarded-for: for= values, quoted IPv6 with ports, obfuscated ones refused', () => {
    const value = 'for=192.0.2.60;proto=http;by=203.0.113.43, For="[2001:db8:cafe::17]:4711", for=198.51.100.9';
    const forwarded = (trustedProxies: number) =>
      clientIp(headers({ forwarded: value }), { header: 'forwarded', trustedProxies });
    expect(forwarded(1)).toBe('198.51.100.9');
    expect(forwarded(2)).toBe('2001:db8:cafe::/56');
    expect(forwarded(3)).toBe('192.0.2.60');
    expect(forwarded(0)).toBeUndefined();
    expect(
      clientIp(headers({ forwarded: 'for=_hidden, for=unknown' }), { header: 'forwarded', trustedProxies: 1 }),
    ).toBeUndefined();
    // A comma inside a quoted value splits nothing.
    expect(
      clientIp(headers({ forwarded: 'for="198.51.100.9";ext="a,b"' }), { header: 'forwarded', trustedProxies: 1 }),
    ).toBe('198.51.100.9');
  });

  it('skips proxies by their address ranges: the nearest entry outside them is the client', () => {
    const ranges = { trustedProxyRanges: ['10.0.0.0/8', 'fd00::/8', '192.0.2.1'] };
    const xff = (value: string) => clientIp(headers({ 'x-forwarded-for': value }), ranges);
    expect(xff('203.0.113.66, 198.51.100.7, 10.1.2.3, fd00::5, 192.0.2.1')).toBe('198.51.100.7');
    // Every entry a trusted proxy's: the furthest.
    expect(xff('10.0.0.9, 10.0.0.1')).toBe('10.0.0.9');
    // A client-written entry left of the client is never reached.
    expect(xff('10.9.9.9, 198.51.100.7, 10.0.0.1')).toBe('198.51.100.7');
  });
});

describe('clientIp on an http.IncomingMessage with trusted ranges or a platform', () => {
  let ranged: Server;
  let url: string;
  beforeAll(async () => {
    ranged = createServer((request, response) => {
      const mode = new URL(request.url!, 'http://x').searchParams.get('mode');
      const options =
        mode === 'loopback'
          ? { trustedProxyRanges: ['127.0.0.0/8'] }
          : mode === 'other'
            ? { trustedProxyRanges: ['10.0.0.0/8'] }
            : mode === 'cf-loopback'
              ? { platform: 'cloudflare' as const, trustedProxyRanges: ['127.0.0.0/8'] }
              : { platform: 'cloudflare' as const, trustedProxyRanges: ['10.0.0.0/8'] };
      response.end(JSON.stringify(clientIp(request, options) ?? null));
    });
    await new Promise<void>((resolve) => ranged.listen(0, '127.0.0.1', resolve));
    url = `http://127.0.0.1:${(ranged.address() as AddressInfo).port}`;
  });
  afterAll(() => new Promise<void>((resolve) => ranged.close(() => resolve())));

  const ask = async (mode: string, headers: Record<string, string>) =>
    (await fetch(`${url}/?mode=${mode}`, { headers })).json();

  it('believes the headers only from a peer in a trusted range', async () => {
    expect(await ask('loopback', { 'x-forwarded-for': '203.0.113.66, 198.51.100.7' })).toBe('198.51.100.7');
    expect(await ask('other', { 'x-forwarded-for': '198.51.100.7' })).toBe('127.0.0.1');
    expect(await ask('cf-loopback', { 'cf-connecting-ip': '198.51.100.8' })).toBe('198.51.100.8');
    expect(await ask('cf-other', { 'cf-connecting-ip': '198.51.100.8' })).toBe('127.0.0.1');
  });
});
