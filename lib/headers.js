'use strict';
// The response headers of a limiter's answer, in each style an app can ask
// for: the IETF RateLimit header drafts 6, 7 and 8 (the shapes
// express-rate-limit 8 writes) or the X-RateLimit-* headers of older APIs.

const STYLES = ['draft-6', 'draft-7', 'draft-8', 'legacy'];

const seconds = (ms) => Math.ceil(ms / 1000);

/** A quota policy of drafts 6 and 7: `10;w=60`, one per limit, comma-separated. */
const policies = (states) => states.map((state) => `${state.limit};w=${seconds(state.windowMs)}`).join(', ');

/**
 * The headers of one answer. `current` is the limit the answer reports (the one that refused, or
 * the one closest to refusing); `states` every limit checked. A refusal always carries Retry-After,
 * whatever the style, since clients that retry at once turn a throttle into an outage.
 */
function limitHeaders(style, states, current, retryAfter) {
  const headers = {};
  switch (style) {
    case 'draft-6':
      headers['RateLimit-Policy'] = policies(states);
      headers['RateLimit-Limit'] = String(current.limit);
      headers['RateLimit-Remaining'] = String(current.remaining);
      headers['RateLimit-Reset'] = String(seconds(current.resetMs));
      break;
    case 'draft-7':
      headers['RateLimit-Policy'] = policies(states);
      headers['RateLimit'] =
        `limit=${current.limit}, remaining=${current.remaining}, reset=${seconds(current.resetMs)}`;
      break;
    case 'draft-8':
      // Structured-field lists with one member per limit, named by its policy. No partition key
      // (`pk`): it would be a hash of the key, and a short hash of an IP address can be reversed.
      headers['RateLimit'] = states
        .map((state) => `"${state.name}"; r=${state.remaining}; t=${seconds(state.resetMs)}`)
        .join(', ');
      headers['RateLimit-Policy'] = states
        .map((state) => `"${state.name}"; q=${state.limit}; w=${seconds(state.windowMs)}`)
        .join(', ');
      break;
    case 'legacy':
      headers['X-RateLimit-Limit'] = String(current.limit);
      headers['X-RateLimit-Remaining'] = String(current.remaining);
      headers['X-RateLimit-Reset'] = String(seconds(current.resetAt));
      break;
    // false: no RateLimit headers.
  }
  if (retryAfter > 0) headers['Retry-After'] = String(retryAfter);
  return headers;
}

module.exports = { STYLES, limitHeaders };
