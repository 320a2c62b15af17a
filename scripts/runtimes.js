'use strict';
// The runtimes ratestore is tested on, pinned in runtimes/package-lock.json and installed from the
// npm registry: `node scripts/runtimes.js` installs them (npm ci --prefix runtimes) and prints
// their paths; `node scripts/runtimes.js --path node24` prints one bin directory; `--ensure` installs
// them only when one is missing (npm run test:e2e, whose Next.js and benchmark runs need Bun and Deno).

const { execFileSync } = require('node:child_process');
const { existsSync } = require('node:fs');
const { dirname, join } = require('node:path');

const ROOT = join(__dirname, '..', 'runtimes', 'node_modules');

/** `[{ name, path, args }]`: each runtime's binary and the arguments it runs a CommonJS script with. */
function runtimes() {
  return [
    { name: 'node22', path: join(ROOT, 'node22', 'bin', 'node'), args: [] },
    { name: 'node24', path: join(ROOT, 'node24', 'bin', 'node'), args: [] },
    { name: 'node26', path: join(ROOT, 'node26', 'bin', 'node'), args: [] },
    { name: 'bun', path: join(ROOT, '@oven', 'bun-linux-x64', 'bin', 'bun'), args: [] },
    // Deno needs every permission a Node.js program has, and to use the node_modules npm made.
    {
      name: 'deno',
      path: join(ROOT, '@deno', 'linux-x64-glibc', 'deno'),
      args: ['run', '--allow-all', '--node-modules-dir=manual'],
    },
  ];
}

/**
 * The runtime named `name`, which must be installed: a missing one is an error that says how to install
 * it, so that a suite needing it fails rather than skips.
 */
function installed(name) {
  const found = runtimes().find((r) => r.name === name);
  if (!found)
    throw new Error(
      `no runtime named ${name}: ${runtimes()
        .map((r) => r.name)
        .join(', ')}`,
    );
  if (!existsSync(found.path)) {
    throw new Error(
      `${name} is not installed (no ${found.path}): install the runtimes pinned in runtimes/package-lock.json ` +
        'with `npm ci --prefix runtimes`',
    );
  }
  return found;
}

function install() {
  execFileSync('npm', ['ci', '--prefix', join(__dirname, '..', 'runtimes'), '--no-audit', '--no-fund'], {
    stdio: 'inherit',
  });
}

if (require.main === module) {
  const [flag, name] = process.argv.slice(2);
  if (flag === '--ensure') {
    const missing = runtimes().filter((r) => !existsSync(r.path));
    if (missing.length > 0) {
      console.error(`ratestore: installing the runtimes (${missing.map((r) => r.name).join(', ')} missing)...`);
      install();
    }
  } else if (flag === '--path') {
    console.log(dirname(installed(name).path));
  } else {
    install();
    for (const r of runtimes()) {
      const version = execFileSync(r.path, ['--version'], { encoding: 'utf8' }).split('\n')[0];
      console.log(`${r.name}\t${version}\t${r.path}`);
    }
  }
}

module.exports = { runtimes, installed };
