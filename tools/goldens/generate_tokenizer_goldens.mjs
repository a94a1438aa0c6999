// Generates tests/fixtures/tokenizer/golden.json: the token ids that two independent
// implementations of the Hugging Face tokenizer produce for every text in corpus.json,
// with the real Qwen3 tokenizer. Run once by hand (npm install && npm run generate); the
// output is committed and the C++ tests never need node or the network.
//
// Oracles:
//  - @lenml/tokenizers: the JavaScript port of transformers.js (the oracle the project
//    names). Its "ids" are the golden.
//  - tokenizers: Hugging Face's own Rust library through its official node binding. Where
//    the JavaScript port disagrees with it (it uses JavaScript regular expressions, whose
//    \s differs from Oniguruma's, and its NFC uses newer Unicode tables than HF's), the case
//    records "hf_rust_ids" and the C++ tokenizer is held to the Rust result, since that is
//    what Hugging Face itself produces.
import { readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { TokenizerLoader } from "@lenml/tokenizers";

const require = createRequire(import.meta.url);
const { Tokenizer: RustTokenizer } = require("tokenizers");

const here = dirname(fileURLToPath(import.meta.url));
const repo = join(here, "..", "..");
const tokenizerDir = process.argv[2] ?? join(repo, "build", "fixtures", "qwen3-tokenizer");
const fixtureDir = join(repo, "tests", "fixtures", "tokenizer");

const tokenizerJsonPath = join(tokenizerDir, "tokenizer.json");
const tokenizerJSON = JSON.parse(readFileSync(tokenizerJsonPath, "utf8"));
const tokenizerConfig = JSON.parse(readFileSync(join(tokenizerDir, "tokenizer_config.json"), "utf8"));
const jsTokenizer = TokenizerLoader.fromPreTrained({ tokenizerJSON, tokenizerConfig });
const rustTokenizer = RustTokenizer.fromFile(tokenizerJsonPath);

const corpus = JSON.parse(readFileSync(join(fixtureDir, "corpus.json"), "utf8"));
const packageVersion = (name) =>
  JSON.parse(readFileSync(join(here, "node_modules", name, "package.json"), "utf8")).version;

const sameIds = (a, b) => a.length === b.length && a.every((id, i) => id === b[i]);

const cases = [];
let disagreements = 0;
for (const { name, text } of corpus) {
  // add_special_tokens=false: the Qwen3 post-processor adds nothing anyway, and the C++
  // encode() never adds BOS/EOS on its own.
  const ids = jsTokenizer.encode(text, { add_special_tokens: false });
  const rustIds = Array.from((await rustTokenizer.encode(text, null, { addSpecialTokens: false })).getIds());
  // The text after the tokenizer's own normalizer (NFC with HF's tables, which predate some
  // combining marks that ICU's NFC reorders): what decode(encode(text)) must give back.
  const nfc = rustTokenizer.getNormalizer().normalizeString(text);
  const entry = { name, text, nfc, ids };
  if (nfc !== text.normalize("NFC")) entry.nfc_icu = text.normalize("NFC");
  if (!sameIds(ids, rustIds)) {
    entry.hf_rust_ids = rustIds;
    disagreements += 1;
    console.warn(`oracles disagree on "${name}":\n  js   ${ids.join(" ")}\n  rust ${rustIds.join(" ")}`);
  }
  // The decoded text as Hugging Face returns it, to check decode() beyond round trips.
  entry.decoded = await rustTokenizer.decode(rustIds, false);
  entry.decoded_skip_special = await rustTokenizer.decode(rustIds, true);
  if (entry.decoded !== nfc) console.warn(`HF's own round trip differs from its NFC on "${name}"`);
  cases.push(entry);
}

const golden = {
  tokenizer: "Qwen3 (tests/fixtures/tokenizer/qwen3, vendored)",
  generator: {
    script: "tools/goldens/generate_tokenizer_goldens.mjs",
    "@lenml/tokenizers": packageVersion(join("@lenml", "tokenizers")),
    tokenizers: packageVersion("tokenizers"),
  },
  cases,
};
writeFileSync(join(fixtureDir, "golden.json"), JSON.stringify(golden, null, 1) + "\n");
console.log(`wrote ${cases.length} cases, ${disagreements} where the oracles disagree`);
