/** A port nothing listens on, on 127.0.0.1. */
export function freePort(): Promise<number>;
/** `start()` again, up to `tries` times (3), when a server it started lost its port before its bind. */
export function retryPortTaken<T>(start: () => Promise<T>, tries?: number): Promise<T>;
