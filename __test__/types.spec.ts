// index.d.ts against what index.js does: every export declared is exported and the other way round;
// each factory's options interface names exactly the options the factory accepts (read from the
// TypeError an unknown option gets); each store's interface names exactly its public members (methods
// and properties on the instance and its prototypes, `_`-prefixed internals aside). A member added on
// one side only fails here.
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';

const require = createRequire(__filename);
const root = join(__dirname, '..');
const ratestore = require('../index.js');
/**
 * index.d.ts's interfaces, read by brace depth (the project's TypeScript, the native compiler, has no
 * JavaScript API): each interface's name, what it extends, and its members' names (the names at the
 * interface's own depth, before `?`, `:` or `(`).
 */
const text = readFileSync(join(root, 'index.d.ts'), 'utf8')
  .replace(/\/\*[\s\S]*?\*\//g, '')
  .replace(/\/\/.*$/gm, '');
const interfaces = new Map<string, { extends: string[]; members: Set<string> }>();
for (const match of text.matchAll(/^(?:export )?interface (\w+)(?:<[^>{]*>)?(?: extends ([^{]+))?\s*\{/gm)) {
  let depth = 1;
  let at = match.index + match[0].length;
  const body: string[] = [];
  let line = '';
  for (; depth > 0 && at < text.length; at++) {
    const c = text[at];
    if (c === '{' || c === '(' || c === '<' || c === '[') depth++;
    else if (c === '}' || c === ')' || (c === '>' && text[at - 1] !== '=') || c === ']') depth--;
    if (c === '\n' || depth === 0) {
      body.push(line);
      line = '';
    } else if (depth === 1 || (depth === 2 && '{(<['.includes(c) && line.trim() !== '' && !line.includes(':')))
      line += c;
  }
  const names = new Set<string>();
  for (const l of body) {
    const m = /^\s*(?:readonly\s+)?([A-Za-z_$][\w$]*)\??\s*[:(<]/.exec(l);
    if (m) names.add(m[1]);
  }
  const parents = (match[2] ?? '')
    .split(',')
    .map((t) => t.replace(/<.*$/, '').trim())
    .filter(Boolean);
  interfaces.set(match[1], { extends: parents, members: names });
}
const exported = new Set([...text.matchAll(/^export declare (?:function|const) (\w+)/gm)].map((m) => m[1]));

/** An interface's member names, those of the interfaces it extends included. */
function members(name: string): Set<string> {
  const decl = interfaces.get(name);
  if (decl === undefined) throw new Error(`index.d.ts declares no interface ${name}`);
  const names = new Set<string>();
  for (const parent of decl.extends) if (interfaces.has(parent)) for (const n of members(parent)) names.add(n);
  for (const n of decl.members) names.add(n);
  return names;
}

/** The options a factory accepts, as its TypeError for an unknown option lists them. */
function accepted(factory: (options: object) => unknown): Set<string> {
  try {
    factory({ notAnOption: 1 });
  } catch (error) {
    const match = /the options are (.+)$/.exec((error as Error).message);
    if (match) return new Set(match[1].split(', '));
    throw error;
  }
  throw new Error('an unknown option was accepted');
}

/** The public members of a store: own and inherited properties, not `_` internals or the constructor. */
function publicMembers(store: object): Set<string> {
  const names = new Set<string>();
  for (let p: object | null = store; p !== null && p !== Object.prototype; p = Object.getPrototypeOf(p)) {
    for (const name of Object.getOwnPropertyNames(p))
      if (!name.startsWith('_') && name !== 'constructor') names.add(name);
  }
  return names;
}

const sorted = (set: Set<string>) => [...set].sort();
const opened: { close(): Promise<void> }[] = [];
afterAll(async () => {
  await Promise.all(opened.map((store) => store.close()));
});

describe('index.d.ts and index.js', () => {
  it('declare the same exports', () => {
    expect(sorted(exported)).toEqual(Object.keys(ratestore).sort());
  });

  const stores = [
    {
      factory: 'memoryStore',
      types: 'MemoryStore',
      options: 'MemoryStoreOptions',
      make: () => ratestore.memoryStore(),
    },
    {
      factory: 'redisStore',
      types: 'RedisStore',
      options: 'RedisStoreOptions',
      make: () => ratestore.redisStore({ url: 'redis://127.0.0.1:9' }),
    },
    {
      factory: 'postgresStore',
      types: 'PostgresStore',
      options: 'PostgresStoreOptions',
      make: () => ratestore.postgresStore({ url: 'postgres://u@127.0.0.1:9/db' }),
    },
    {
      factory: 'sqliteStore',
      types: 'SqliteStore',
      options: 'SqliteStoreOptions',
      make: () => ratestore.sqliteStore({ path: ':memory:' }),
    },
    {
      factory: 'mysqlStore',
      types: 'MysqlStore',
      options: 'MysqlStoreOptions',
      make: () => ratestore.mysqlStore({ url: 'mysql://u@127.0.0.1:9/db' }),
    },
  ];

  for (const { factory, types, options, make } of stores) {
    it(`${options} names exactly the options ${factory}() accepts`, () => {
      expect(sorted(members(options))).toEqual(sorted(accepted(ratestore[factory])));
    });

    it(`${types} names exactly the public members of what ${factory}() answers`, () => {
      const store = make();
      opened.push(store);
      expect(sorted(members(types))).toEqual(sorted(publicMembers(store)));
    });
  }

  it("createLimiter's option types name exactly the options it accepts", () => {
    const declared = new Set([
      ...members('LimiterCommonOptions'),
      ...members('MultiLimiterOptions'),
      ...members('TieredLimiterOptions'),
      ...members('WindowLimit'),
      ...members('TokenBucketLimit'),
      ...members('ConcurrencyLimit'),
    ]);
    expect(sorted(declared)).toEqual(sorted(accepted(ratestore.createLimiter)));
  });
});
