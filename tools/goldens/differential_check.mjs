// Differential check of the C++ tokenizer against Hugging Face's Rust tokenizers on random
// Unicode-heavy strings (every script block, combining marks, astral and unassigned code
// points, whitespace oddities, contractions, special tokens). Not part of the test suite
// (it needs node and the npm packages); run it after changing src/tokenizer/:
//   node differential_check.mjs /tmp/encode_batch [SEED] [COUNT] [TOKENIZER_DIR]
// (encode_batch.cpp says how to build the first argument). Prints each difference.
import { execFileSync } from "node:child_process";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const require = createRequire(import.meta.url);
const { Tokenizer } = require("tokenizers");
const here = dirname(fileURLToPath(import.meta.url));
const [batchBinary, seedArg = "12345", countArg = "4000"] = process.argv.slice(2);
const tokenizerDir = process.argv[5] ?? join(here, "..", "..", "..", "shared", "data", "qwen3-tokenizer");
const hf = Tokenizer.fromFile(join(tokenizerDir, "tokenizer.json"));

let seed = Number(seedArg) >>> 0 || 1;
const rand = () => {  // xorshift32: deterministic for a seed
  seed ^= seed << 13; seed >>>= 0; seed ^= seed >>> 17; seed ^= seed << 5; seed >>>= 0;
  return seed / 4294967296;
};
const span = (first, size) => () => String.fromCodePoint(first + Math.floor(rand() * size));
const pools = [
  span(0x20, 95),                                              // ASCII
  () => " \t\n\r\u00a0\u0085\u2028\u3000\u200b\ufeff"[Math.floor(rand() * 10)],
  span(0x80, 0x780),                                           // Latin, Greek, Cyrillic, marks
  span(0x300, 0x70),                                           // combining marks
  span(0x900, 0x1700),                                         // Indic to Ethiopic
  span(0x1100, 0x1000),                                        // jamo, Khmer, marks extended
  span(0x2000, 0x2000),                                        // punctuation, symbols
  span(0x3000, 0x7000),                                        // CJK
  span(0xa000, 0x3000),                                        // Yi to Hangul
  span(0xf900, 0x600),                                         // compatibility, presentation
  span(0x10000, 0x20000),                                      // astral, incl. unassigned
  span(0x1f300, 0x700),                                        // emoji
  () => ["'s", "'S", "'ll", "'\u017f", "<|im_end|>", "<think>", "123", "\r\n", "  "][Math.floor(rand() * 9)],
];
const texts = [];
for (let i = 0; i < Number(countArg); i++) {
  let text = "";
  for (let n = Math.floor(rand() * 30); n > 0; n--) {
    const piece = pools[Math.floor(rand() * pools.length)]();
    const cp = piece.codePointAt(0);
    text += piece.length === 1 && cp >= 0xd800 && cp <= 0xdfff ? "x" : piece;  // no lone surrogates
  }
  texts.push(text);
}
const ours = JSON.parse(execFileSync(batchBinary, [tokenizerDir], { input: JSON.stringify(texts), maxBuffer: 1 << 28 }));
let differing = 0;
for (let i = 0; i < texts.length; i++) {
  const theirs = Array.from((await hf.encode(texts[i], null, { addSpecialTokens: false })).getIds());
  if (JSON.stringify(theirs) !== JSON.stringify(ours[i])) {
    differing++;
    console.log(`DIFF ${JSON.stringify(texts[i])}\n  hf   ${theirs.join(" ")}\n  ours ${ours[i].join(" ")}`);
  }
}
console.log(`${texts.length} texts, ${differing} differ from Hugging Face tokenizers`);
process.exit(differing === 0 ? 0 : 1);
