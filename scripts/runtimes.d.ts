export interface Runtime {
  /** node22, node24, node26, bun or deno. */
  readonly name: string;
  /** The runtime's binary, under runtimes/node_modules. */
  readonly path: string;
  /** The arguments it runs a CommonJS script with, before the script. */
  readonly args: readonly string[];
}

/** Every runtime the runtimes package pins, installed or not. */
export function runtimes(): Runtime[];

/** The runtime named `name`; throws, saying how to install it, when it is not installed. */
export function installed(name: string): Runtime;
