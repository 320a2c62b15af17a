'use strict';
// The client's address, for a key a client cannot choose. Behind proxies, only what the trusted
// proxies wrote can be believed: each appends the address it saw to x-forwarded-for (or RFC 7239's
// Forwarded), so the entries are read from the right, past the trusted proxies (a count of them, or
// their address ranges); anything to their left came from the client, who could have written any
// address there. Behind a platform that sets a header of its own (cf-connecting-ip, …), the app names
// it; none is trusted by default. An IPv6 client answers its subnet (a /56 by default), since every
// IPv6 host holds at least a /64 and could otherwise send each request from a new address.

const { isIP } = require('node:net');
const { checkOptions, checkOption, rangeError, typeError } = require('./check.js');

/** The platforms whose header of the client's address an app can name, and that header. */
const PLATFORMS = {
  vercel: 'x-vercel-forwarded-for',
  cloudflare: 'cf-connecting-ip',
  fly: 'fly-client-ip',
  fastly: 'fastly-client-ip',
  akamai: 'true-client-ip',
};
/** Headers a platform or the proxy in front sets to the one address it saw (overwriting the client's). */
const SINGLE = new Set([...Object.values(PLATFORMS), 'x-real-ip']);
/** Headers each proxy appends to. */
const LISTS = new Set(['x-forwarded-for', 'forwarded']);
const DEFAULT_SUBNET = 56;
const OPTIONS = ['trustedProxies', 'trustedProxyRanges', 'header', 'platform', 'ipv6Subnet'];

// ---------------------------------------------------------------------------
// Addresses

/** An IPv4 address's four bytes, or undefined. */
function parse4(text) {
  if (isIP(text) !== 4) return undefined;
  return text.split('.').map(Number);
}

/** An IPv6 address's eight 16-bit groups and whether it ended in a dotted quad, or undefined. */
function parse6(text) {
  const zone = text.indexOf('%');
  if (zone >= 0) text = text.slice(0, zone);
  if (isIP(text) !== 6) return undefined;
  let dotted = false;
  let tail = [];
  const lastColon = text.lastIndexOf(':');
  if (text.indexOf('.', lastColon) >= 0) {
    const [a, b, c, d] = parse4(text.slice(lastColon + 1));
    tail = [(a << 8) | b, (c << 8) | d];
    text = `${text.slice(0, lastColon + 1)}0:0`;
    dotted = true;
  }
  const halves = text.split('::');
  const groups = (part) => (part === '' ? [] : part.split(':').map((g) => Number.parseInt(g, 16)));
  let words;
  if (halves.length === 2) {
    const head = groups(halves[0]);
    const rest = groups(halves[1]);
    words = [...head, ...Array(8 - head.length - rest.length).fill(0), ...rest];
  } else {
    words = groups(text);
  }
  if (dotted) words.splice(6, 2, ...tail);
  return { words, dotted };
}

/** Eight groups in RFC 5952's form: lower case, no leading zeros, the first longest run of 2+ zero groups as `::`. */
function format6(words) {
  let best = -1;
  let bestLength = 1;
  for (let i = 0; i < 8;) {
    if (words[i] !== 0) {
      i++;
      continue;
    }
    let j = i;
    while (j < 8 && words[j] === 0) j++;
    if (j - i > bestLength) {
      best = i;
      bestLength = j - i;
    }
    i = j;
  }
  const hex = words.map((w) => w.toString(16));
  if (best < 0) return hex.join(':');
  return `${hex.slice(0, best).join(':')}::${hex.slice(best + bestLength).join(':')}`;
}

/** An IPv6 address's first `prefix` bits, the rest zero. */
function mask6(words, prefix) {
  return words.map((w, i) => {
    const bits = Math.max(0, Math.min(16, prefix - 16 * i));
    return bits === 16 ? w : bits === 0 ? 0 : w & (0xffff << (16 - bits)) & 0xffff;
  });
}

/**
 * What an address parses to: `{ v4: bytes }` or `{ v6: words }`, an IPv4-mapped address
 * (`::ffff:1.2.3.4`, `::ffff:102:304`) or an IPv4-compatible one written with its dotted quad
 * (`::1.2.3.4`) as the IPv4 address it holds; undefined for anything else.
 */
function parseAddress(text) {
  const v4 = parse4(text);
  if (v4 !== undefined) return { v4 };
  const v6 = parse6(text);
  if (v6 === undefined) return undefined;
  const { words, dotted } = v6;
  const zeros = words.slice(0, 5).every((w) => w === 0);
  if (zeros && (words[5] === 0xffff || (words[5] === 0 && dotted))) {
    return { v4: [words[6] >> 8, words[6] & 0xff, words[7] >> 8, words[7] & 0xff] };
  }
  return { v6: words };
}

/** An address as proxies write it (`1.2.3.4:80`, `[::1]:443`, `"[::1]"`) without its port or brackets, or undefined. */
function strip(entry) {
  let address = entry.trim();
  if (address.length >= 2 && address.startsWith('"') && address.endsWith('"')) address = address.slice(1, -1);
  const bracketed = /^\[([^\]]+)\](?::\d+)?$/.exec(address);
  if (bracketed) address = bracketed[1];
  else if (/^[\d.]+:\d+$/.test(address)) address = address.slice(0, address.indexOf(':'));
  return address;
}

/**
 * The IPv4 client an IPv6 address carries in a transition form, or undefined: NAT64's well-known prefix
 * (64:ff9b::/96, the IPv4 address in the last 32 bits), 6to4 (2002::/16, in the next 32 bits: a 6to4
 * site gets a /48 per IPv4 address, 256 of the /56s a client is keyed by) and Teredo (2001:0::/32, the
 * client's public address inverted in the last 32 bits; a Teredo server's many clients share its /56).
 * Such a client is keyed by its IPv4 address, as it would be reaching the app over IPv4.
 */
function tunnelled4(w) {
  const bytes = (hi, lo) => [hi >> 8, hi & 0xff, lo >> 8, lo & 0xff];
  if (w[0] === 0x64 && w[1] === 0xff9b && w[2] === 0 && w[3] === 0 && w[4] === 0 && w[5] === 0) {
    return bytes(w[6], w[7]);
  }
  if (w[0] === 0x2002) return bytes(w[1], w[2]);
  if (w[0] === 0x2001 && w[1] === 0) return bytes(w[6] ^ 0xffff, w[7] ^ 0xffff);
  return undefined;
}

/** The key form of an address: IPv4 dotted, IPv6 in RFC 5952's form or its subnet's (`2001:db8:ab00::/56`). */
function keyOf(parsed, subnet) {
  if (parsed.v4 !== undefined) return parsed.v4.join('.');
  const v4 = tunnelled4(parsed.v6);
  if (v4 !== undefined) return v4.join('.');
  if (subnet === false) return format6(parsed.v6);
  return `${format6(mask6(parsed.v6, subnet))}/${subnet}`;
}

// ---------------------------------------------------------------------------
// Trusted ranges

/** A CIDR (`10.0.0.0/8`, `2001:db8::/32`) or a bare address, as `{ v4 | v6, prefix }`; throws when it is neither. */
function parseRange(text, i) {
  const where = `clientIp(options): trustedProxyRanges[${i}]`;
  if (typeof text !== 'string') throw typeError(`${where} must be a string (a CIDR such as '10.0.0.0/8')`);
  const slash = text.indexOf('/');
  const written = (slash < 0 ? text : text.slice(0, slash)).trim();
  const address = parseAddress(written);
  // An IPv4-mapped range (::ffff:10.0.0.0/104) counts the 96 bits before its IPv4 part.
  const bits = address?.v4 !== undefined && !written.includes(':') ? 32 : 128;
  const prefix = slash < 0 ? bits : Number(text.slice(slash + 1));
  const ok = address !== undefined && Number.isInteger(prefix) && prefix >= 0 && prefix <= bits;
  if (!ok || (address.v4 !== undefined && bits === 128 && prefix < 96)) {
    throw rangeError(`${where} must be an IP address or a CIDR such as '10.0.0.0/8' or 'fd00::/8'`);
  }
  return { ...address, prefix: address.v4 !== undefined && bits === 128 ? prefix - 96 : prefix };
}

function inRange(parsed, range) {
  const [a, b, width] = parsed.v4 !== undefined ? [parsed.v4, range.v4, 8] : [parsed.v6, range.v6, 16];
  if (b === undefined) return false;
  for (let i = 0, left = range.prefix; left > 0; i++, left -= width) {
    const bits = Math.min(width, left);
    const mask = ((1 << bits) - 1) << (width - bits);
    if ((a[i] & mask) !== (b[i] & mask)) return false;
  }
  return true;
}

// ---------------------------------------------------------------------------
// Headers

/** RFC 7239 Forwarded: each element's `for=` value, in order (an element without one gives undefined). */
function forwardedFor(value) {
  const elements = [];
  let element = '';
  let quoted = false;
  for (let i = 0; i < value.length; i++) {
    const c = value[i];
    if (c === '"') quoted = !quoted;
    else if (c === '\\' && quoted) {
      element += c + (value[++i] ?? '');
      continue;
    }
    if (c === ',' && !quoted) {
      elements.push(element);
      element = '';
    } else element += c;
  }
  elements.push(element);
  return elements.map((part) => {
    for (const pair of part.split(';')) {
      const eq = pair.indexOf('=');
      if (eq > 0 && pair.slice(0, eq).trim().toLowerCase() === 'for') return pair.slice(eq + 1).trim();
    }
    return undefined;
  });
}

/** A header's value from a Fetch Request, Headers, Express request or IncomingMessage, and the socket's peer. */
function readRequest(request, name) {
  if (request !== null && typeof request === 'object') {
    if (typeof request.get === 'function')
      return { value: request.get(name) ?? undefined, peer: request.socket?.remoteAddress };
    const { headers } = request;
    if (headers !== null && typeof headers === 'object') {
      if (typeof headers.get === 'function') return { value: headers.get(name) ?? undefined };
      const value = headers[name];
      return { value: Array.isArray(value) ? value.join(',') : value, peer: request.socket?.remoteAddress };
    }
  }
  throw typeError('clientIp(request): request must be a Fetch Request, a Headers object or an http.IncomingMessage');
}

// ---------------------------------------------------------------------------

function readOptions(options) {
  const given = checkOptions('clientIp', options, OPTIONS);
  const { trustedProxies, trustedProxyRanges, platform, ipv6Subnet = DEFAULT_SUBNET } = given;
  let { header } = given;
  checkOption('clientIp', 'trustedProxies', trustedProxies, 'number');
  if (trustedProxies !== undefined && !(trustedProxies >= 0 && Number.isSafeInteger(trustedProxies))) {
    throw rangeError(`clientIp(options): trustedProxies must be a non-negative safe integer, got ${trustedProxies}`);
  }
  let ranges;
  if (trustedProxyRanges !== undefined) {
    if (!Array.isArray(trustedProxyRanges)) {
      throw typeError('clientIp(options): trustedProxyRanges must be an array of CIDRs');
    }
    if (trustedProxies !== undefined) {
      throw typeError('clientIp(options): give trustedProxies (a count) or trustedProxyRanges (CIDRs), not both');
    }
    ranges = Array.from(trustedProxyRanges, parseRange);
  }
  if (platform !== undefined) {
    if (typeof platform !== 'string') throw typeError(`clientIp(options): platform must be a string`);
    if (!Object.hasOwn(PLATFORMS, platform)) {
      throw rangeError(`clientIp(options): platform must be one of ${Object.keys(PLATFORMS).join(', ')}`);
    }
    if (header !== undefined) throw typeError('clientIp(options): give platform or header, not both');
    header = PLATFORMS[platform];
  }
  if (header === undefined) header = 'x-forwarded-for';
  else {
    if (typeof header !== 'string') throw typeError('clientIp(options): header must be a string');
    header = header.toLowerCase();
    if (!SINGLE.has(header) && !LISTS.has(header)) {
      throw rangeError(`clientIp(options): header must be one of ${[...LISTS, ...SINGLE].join(', ')}`);
    }
  }
  if (ipv6Subnet !== false) {
    if (typeof ipv6Subnet !== 'number') throw typeError('clientIp(options): ipv6Subnet must be a number or false');
    if (!(Number.isInteger(ipv6Subnet) && ipv6Subnet >= 1 && ipv6Subnet <= 128)) {
      throw rangeError(`clientIp(options): ipv6Subnet must be an integer from 1 to 128 (or false), got ${ipv6Subnet}`);
    }
  }
  return { trustedProxies: trustedProxies ?? 0, ranges, header, subnet: ipv6Subnet };
}

/**
 * The client's address as a key (see the module's comment), or undefined when the request does not say
 * (no trusted entry, or one that is not an IP address).
 */
function clientIp(request, options) {
  const { trustedProxies, ranges, header, subnet } = readOptions(options);
  const { value, peer } = readRequest(request, header);
  const peerAddress = peer === undefined ? undefined : parseAddress(strip(peer));
  const trusted = (parsed) => parsed !== undefined && ranges.some((range) => inRange(parsed, range));
  const answer = (parsed) => (parsed === undefined ? undefined : keyOf(parsed, subnet));

  if (SINGLE.has(header)) {
    // The platform's header, believed when the request came through it: with ranges, only from a peer
    // in them (a Fetch Request has no peer: it came through the platform).
    if (ranges !== undefined && peer !== undefined && !trusted(peerAddress)) return answer(peerAddress);
    if (typeof value !== 'string' || value.trim() === '') return peer === undefined ? undefined : answer(peerAddress);
    // A platform overwrites the header with one address; entries appended after it are nearer proxies'.
    const entries = value.split(',');
    return answer(parseAddress(strip(entries[entries.length - 1])));
  }

  // Nearest first: the socket's peer (when known), then what each proxy wrote, right to left.
  const written = typeof value === 'string' && value !== '' ? value : undefined;
  const entries = written === undefined ? [] : header === 'forwarded' ? forwardedFor(written) : written.split(',');
  const hops = entries.reverse().map((entry) => (entry === undefined ? undefined : parseAddress(strip(entry))));
  if (peer !== undefined) hops.unshift(peerAddress);
  if (hops.length === 0) return undefined;
  if (ranges !== undefined) {
    // Past every hop in a trusted range: the first that is not is the client (a Fetch Request's
    // nearest entry was written by the proxy in front, and is read as any other).
    for (const hop of hops) if (!trusted(hop)) return answer(hop);
    return answer(hops[hops.length - 1]);
  }
  // A Fetch Request has no socket: its first hop is what the nearest proxy wrote.
  const index = peer !== undefined ? trustedProxies : trustedProxies - 1;
  if (index < 0) return undefined;
  // Fewer hops than proxies: every entry was written by a trusted proxy, and the furthest is the client.
  return answer(hops[Math.min(index, hops.length - 1)]);
}

module.exports = { clientIp, PLATFORMS };
