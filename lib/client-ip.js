'use strict';
// The client's address behind a known number of proxies. Each proxy appends
// the address it saw to x-forwarded-for, so only the entries the trusted
// proxies wrote, counted from the right, can be believed: anything to their
// left came from the client, who could have written any address there.

const { isIP } = require('node:net');
const { checkOptions, checkOption, rangeError, typeError } = require('./check.js');

/** An address as proxies write it (`1.2.3.4:80`, `[::1]:443`, `::ffff:1.2.3.4`) as a plain IP, or undefined. */
function normalize(entry) {
  let address = entry.trim();
  const bracketed = /^\[([^\]]+)\](?::\d+)?$/.exec(address);
  if (bracketed) address = bracketed[1];
  else if (/^[\d.]+:\d+$/.test(address)) address = address.slice(0, address.indexOf(':'));
  const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(address);
  if (mapped) address = mapped[1];
  return isIP(address) === 0 ? undefined : address.toLowerCase();
}

/** The request's x-forwarded-for and, on Node's IncomingMessage, the socket's peer. */
function readRequest(request) {
  if (request !== null && typeof request === 'object') {
    if (typeof request.get === 'function') return { forwarded: request.get('x-forwarded-for') };
    const { headers } = request;
    if (headers !== null && typeof headers === 'object') {
      if (typeof headers.get === 'function') return { forwarded: headers.get('x-forwarded-for') };
      const value = headers['x-forwarded-for'];
      return { forwarded: Array.isArray(value) ? value.join(',') : value, peer: request.socket?.remoteAddress };
    }
  }
  throw typeError('clientIp(request): request must be a Fetch Request, a Headers object or an http.IncomingMessage');
}

function clientIp(request, options) {
  const { trustedProxies = 0 } = checkOptions('clientIp', options, ['trustedProxies']);
  checkOption('clientIp', 'trustedProxies', trustedProxies, 'number');
  if (!(trustedProxies >= 0 && Number.isSafeInteger(trustedProxies))) {
    throw rangeError(`clientIp(options): trustedProxies must be a non-negative safe integer, got ${trustedProxies}`);
  }
  const { forwarded, peer } = readRequest(request);
  // Nearest first: the socket's peer (when known), then what each proxy saw, right to left.
  const hops = typeof forwarded === 'string' && forwarded !== '' ? forwarded.split(',').reverse() : [];
  if (peer !== undefined) hops.unshift(peer);
  // A Fetch Request has no socket: its first hop is what the nearest proxy wrote.
  const index = peer !== undefined ? trustedProxies : trustedProxies - 1;
  if (index < 0 || hops.length === 0) return undefined;
  // Fewer hops than proxies: every entry was written by a trusted proxy, and the furthest is the client.
  return normalize(hops[Math.min(index, hops.length - 1)]);
}

module.exports = { clientIp };
