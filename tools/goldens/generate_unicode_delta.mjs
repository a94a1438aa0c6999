// Prints the letter (\p{L}) and number (\p{N}) code points that Hugging Face's tokenizers
// (Oniguruma, Unicode 16 at tokenizers 0.23) classifies as such but this machine's PCRE2
// (10.42, Unicode 14) does not: src/tokenizer/unicode.cpp adds them to \p{L} / \p{N}.
// Run: g++ -std=c++20 -O2 pcre2_missing_letters.cpp -lpcre2-8 -o /tmp/pcre2_missing_letters
//      node generate_unicode_delta.mjs /tmp/pcre2_missing_letters
// Candidates are the letters/numbers of node's ICU (newer than both) that PCRE2 misses; each
// is kept only if HF's own pre-tokenizer treats it as a letter or number: "X's" ends in the
// contraction token "'s" only when X is \p{L} or \p{N} for the Split regex.
import { execFileSync } from "node:child_process";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const require = createRequire(import.meta.url);
const { Tokenizer } = require("tokenizers");
const here = dirname(fileURLToPath(import.meta.url));
const tokenizerDir = process.argv[3] ?? join(here, "..", "..", "..", "shared", "data", "qwen3-tokenizer");
const hf = Tokenizer.fromFile(join(tokenizerDir, "tokenizer.json"));

const icu = { L: [], N: [] };
for (let cp = 0; cp <= 0x10ffff; cp++) {
  if (cp >= 0xd800 && cp <= 0xdfff) continue;
  const c = String.fromCodePoint(cp);
  if (/\p{L}/u.test(c)) icu.L.push(cp);
  else if (/\p{N}/u.test(c)) icu.N.push(cp);
}
const missing = JSON.parse(execFileSync(process.argv[2], { input: JSON.stringify(icu), maxBuffer: 1 << 26 }));
const contraction = Array.from((await hf.encode("'s", null, { addSpecialTokens: false })).getIds());
const ranges = (cps) => {
  const out = [];
  for (const cp of cps) {
    if (out.length && out[out.length - 1][1] === cp - 1) out[out.length - 1][1] = cp;
    else out.push([cp, cp]);
  }
  return out;
};
for (const name of ["L", "N"]) {
  const known = [];
  for (const cp of missing[name]) {
    const ids = Array.from((await hf.encode(String.fromCodePoint(cp) + "'s", null, { addSpecialTokens: false })).getIds());
    if (ids[ids.length - 1] === contraction[0]) known.push(cp);
  }
  const hex = (cp) => "0x" + cp.toString(16).toUpperCase();
  console.log(`// \\p{${name}}: ${known.length} code points of ${missing[name].length} PCRE2 misses`);
  console.log(ranges(known).map(([a, b]) => `{${hex(a)}, ${hex(b)}}`).join(", "));
}
