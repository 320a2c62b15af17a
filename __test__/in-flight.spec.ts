import { createRequire } from 'node:module';
import { describe, expect, it } from 'vitest';

// The JS side's table of calls in flight, shared by every native store that settles in batches.
interface Table {
  slot(): number;
  slots(n: number): number[];
  free(slot: number): void;
  track(slot: number, op: number): Promise<unknown>;
}
const { InFlight } = createRequire(__filename)('../lib/in-flight.js') as {
  InFlight: new (failures: unknown) => Table;
};

const failures = { failed: (error: Error) => error, tell: () => {} };

describe('InFlight', () => {
  it('hands out distinct slots after a fresh slot is freed untracked (a call answered at once, or not sent)', () => {
    const inFlight = new InFlight(failures);
    const fresh = inFlight.slot();
    inFlight.free(fresh);
    const slots = inFlight.slots(2);
    expect(new Set(slots).size).toBe(2);
    for (const slot of slots) inFlight.track(slot, 0);
    expect(new Set([...slots, inFlight.slot()]).size).toBe(3);
  });

  it('reuses a tracked slot once it is freed, and never hands one out twice', () => {
    const inFlight = new InFlight(failures);
    const [a, b] = inFlight.slots(2);
    inFlight.track(a, 0);
    inFlight.track(b, 0);
    const c = inFlight.slot();
    inFlight.free(c);
    const more = inFlight.slots(3);
    expect(new Set([a, b, ...more]).size).toBe(5);
  });
});
