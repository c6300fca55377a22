// The reference side of //worker/io:bpe_gpt2_js_test: encodes each string of a
// JSON array with the npm package gpt-3-encoder's own encoder and prints a
// JSON array of their token id arrays.
//   node bpe_gpt2_js_encode.js PACKAGE_DIR STRINGS.json > IDS.json
'use strict';
const fs = require('fs');
const path = require('path');

const [packageDir, stringsPath] = process.argv.slice(2);
const { encode } = require(path.resolve(packageDir));
const strings = JSON.parse(fs.readFileSync(stringsPath, 'utf-8'));
process.stdout.write(JSON.stringify(strings.map((s) => encode(s))));
