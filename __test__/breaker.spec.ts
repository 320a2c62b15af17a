// The limiter's circuit over its main store (lib/limiter/breaker.js), with time as a value: when it
// opens, when a probe is due, what a probe's answer does, and which errors count as an outage.
import { createRequire } from 'node:module';
import { describe, expect, it } from 'vitest';

const require = createRequire(__filename);
const { Breaker, isOutage, isUnsent, isBadInput } = require('../lib/limiter/breaker.js');

const outage = Object.assign(new Error('down'), { code: 'ERR_CONNECTION', sent: false });

describe('Breaker', () => {
  it('is closed until a failure opens it, and a second failure keeps the first error', () => {
    const b = new Breaker(250);
    expect(b.open).toBe(false);
    expect(b.probeDue(1_000)).toBe(false);
    b.fail(outage, 1_000);
    expect(b.open).toBe(true);
    expect(b.error).toBe(outage);
    b.fail(new Error('later'), 1_100);
    expect(b.error).toBe(outage);
  });

  it('probes once per probeMs, one at a time; an answered probe closes it', () => {
    const b = new Breaker(250);
    b.fail(outage, 1_000);
    expect(b.probeDue(1_249)).toBe(false);
    expect(b.probeDue(1_250)).toBe(true);
    // One at a time: none while the first is under way, however late.
    expect(b.probeDue(9_999)).toBe(false);
    b.probed(1_260, undefined);
    expect(b.open).toBe(false);
    expect(b.error).toBeUndefined();
    expect(b.probeDue(99_999)).toBe(false);
  });

  it('a failed probe keeps it open with the probe error, the next probe probeMs after it ended', () => {
    const b = new Breaker(100);
    b.fail(outage, 0);
    expect(b.probeDue(100)).toBe(true);
    const probeError = new Error('still down');
    b.probed(130, probeError);
    expect(b.open).toBe(true);
    expect(b.error).toBe(probeError);
    expect(b.probeDue(229)).toBe(false);
    expect(b.probeDue(230)).toBe(true);
  });
});

describe("what a store's error says", () => {
  const error = (code: string, extra: object = {}) => Object.assign(new Error(code), { code, ...extra });

  it('a wrong call or a key holding other data is no outage; a lost connection, a timeout or a non-error is', () => {
    for (const code of ['ERR_INVALID_ARG_TYPE', 'ERR_OUT_OF_RANGE', 'ERR_COUNT_RANGE', 'ERR_STORE_ANSWER'])
      expect(isOutage(error(code))).toBe(false);
    expect(isOutage(Object.assign(new Error('WRONGTYPE Operation against a key'), { code: 'ERR_REDIS' }))).toBe(false);
    expect(isOutage(Object.assign(new Error('MASTERDOWN'), { code: 'ERR_REDIS' }))).toBe(true);
    expect(isOutage(error('ERR_CONNECTION'))).toBe(true);
    expect(isOutage(error('ERR_TIMEOUT', { sent: true }))).toBe(true);
    expect(isOutage('a string')).toBe(true);
    expect(isOutage(null)).toBe(true);
  });

  it('unsent: sent false, or a code that is never sent; bad input: the two argument codes', () => {
    expect(isUnsent(error('ERR_TIMEOUT', { sent: false }))).toBe(true);
    expect(isUnsent(error('ERR_TIMEOUT', { sent: true }))).toBe(false);
    for (const code of ['ERR_CONFIG', 'ERR_AUTH', 'ERR_CLOSED']) expect(isUnsent(error(code))).toBe(true);
    expect(isUnsent(error('ERR_CONNECTION'))).toBe(false);
    expect(isBadInput(error('ERR_OUT_OF_RANGE'))).toBe(true);
    expect(isBadInput(error('ERR_COUNT_RANGE'))).toBe(false);
    expect(isBadInput(undefined)).toBe(false);
  });
});
