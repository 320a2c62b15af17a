// Which runtime is running, and so which transport one Redis server gets: the event loop only on Node.js.
import { describe, expect, it } from 'vitest';
// @ts-expect-error: lib/runtime.js is internal, with no types of its own.
import { detectRuntime, runtime } from '../lib/runtime.js';

describe('detectRuntime', () => {
  it('gives the event loop to Node.js only', () => {
    expect(runtime).toEqual({ name: 'Node.js', version: process.versions.node, eventLoop: true });
    const node = { versions: { node: '24.22.3', uv: '1.51.0' } };
    expect(detectRuntime(node, {}).eventLoop).toBe(true);
    // Bun and Deno say they are Node.js too (versions.node), and Bun even has versions.uv.
    expect(detectRuntime({ versions: { ...node.versions, bun: '1.4.5' } }, {})).toEqual({
      name: 'Bun',
      version: '1.4.5',
      eventLoop: false,
    });
    expect(detectRuntime(node, { Bun: { version: '1.4.5' } })).toMatchObject({ name: 'Bun', eventLoop: false });
    expect(detectRuntime({ versions: { ...node.versions, deno: '2.9.6' } }, {})).toEqual({
      name: 'Deno',
      version: '2.9.6',
      eventLoop: false,
    });
    expect(detectRuntime(node, { Deno: { version: { deno: '2.9.6' } } })).toMatchObject({
      name: 'Deno',
      version: '2.9.6',
      eventLoop: false,
    });
    // Anything else that loads the addon is not assumed to have Node's libuv.
    expect(detectRuntime({ versions: { node: '22.0.0' } }, {}).eventLoop).toBe(false);
    expect(detectRuntime(undefined, {}).eventLoop).toBe(false);
  });
});
