'use strict';
// `npm version` runs this (package.json's "version" script) once it has bumped package.json: the
// crate takes the same version, since the binary reports it through version() and the loader
// refuses a binary whose version differs from the package's.

const { readFileSync, writeFileSync } = require('node:fs');
const { join } = require('node:path');

const root = join(__dirname, '..');
const { version } = require('../package.json');

function setVersion(file, pattern) {
  const path = join(root, file);
  const text = readFileSync(path, 'utf8');
  if (!pattern.test(text)) throw new Error(`sync-version: no version of the ratestore crate found in ${file}`);
  writeFileSync(path, text.replace(pattern, `$1${version}$2`));
}

setVersion('Cargo.toml', /^(\[package\]\nname = "ratestore"\nversion = ")[^"]+(")/m);
setVersion('Cargo.lock', /^(\[\[package\]\]\nname = "ratestore"\nversion = ")[^"]+(")/m);
