#!/usr/bin/env bash
# kvaudit tokenize: ids on stdout (plain and --json) equal the committed Hugging Face
# goldens, broken UTF-8 is accepted, and bad tokenizer folders exit 2 with one line.
# Usage: tokenize.sh KVAUDIT_BINARY SOURCE_DIR BUILD_DIR
source "$(dirname "$0")/lib.bash" "$@"
set -e  # a command that fails (the golden's extraction) fails the test
source_dir=$root
tokenizer_dir="${KVAUDIT_QWEN3_TOKENIZER:-$build/fixtures/qwen3-tokenizer}"  # vendored, extracted by CMake

# The chat_template golden: text and ids straight from golden.json.
/usr/bin/python3 - "$source_dir/tests/fixtures/tokenizer/golden.json" "$work" <<'PY'
import json, sys
cases = {c["name"]: c for c in json.load(open(sys.argv[1], encoding="utf-8"))["cases"]}
case = cases["chat_template"]
open(sys.argv[2] + "/text", "w", encoding="utf-8", newline="").write(case["text"])
open(sys.argv[2] + "/plain", "w").write(" ".join(map(str, case["ids"])) + "\n")
open(sys.argv[2] + "/json", "w").write(json.dumps({"ids": case["ids"]}, separators=(",", ":")) + "\n")
PY

"$kvaudit" tokenize --tokenizer "$tokenizer_dir" < "$work/text" > "$work/out_plain"
cmp -s "$work/out_plain" "$work/plain" || fail "plain ids differ: $(cat "$work/out_plain")"
"$kvaudit" tokenize --tokenizer "$tokenizer_dir" --json < "$work/text" > "$work/out_json"
cmp -s "$work/out_json" "$work/json" || fail "json ids differ: $(cat "$work/out_json")"

# Empty input: an empty list, not an error.
[[ "$("$kvaudit" tokenize --tokenizer "$tokenizer_dir" --json < /dev/null)" == '{"ids":[]}' ]] \
  || fail "empty input"

# Invalid UTF-8 is replaced, never fatal: same ids as the U+FFFD text.
printf 'a\xff\xc3b' | "$kvaudit" tokenize --tokenizer "$tokenizer_dir" > "$work/bad"
printf 'a\xef\xbf\xbd\xef\xbf\xbdb' | "$kvaudit" tokenize --tokenizer "$tokenizer_dir" > "$work/replaced"
cmp -s "$work/bad" "$work/replaced" || fail "invalid UTF-8 not handled as U+FFFD"

# A missing folder and a folder without tokenizer.json: exit 2, one line on stderr.
for bad_dir in "$work/missing" "$work"; do
  set +e
  "$kvaudit" tokenize --tokenizer "$bad_dir" < /dev/null > "$work/stdout" 2> "$work/stderr"
  code=$?
  set -e
  [[ $code -eq 2 ]] || fail "exit $code for $bad_dir"
  [[ $(wc -l < "$work/stderr") -eq 1 ]] || fail "stderr not one line: $(cat "$work/stderr")"
  [[ ! -s "$work/stdout" ]] || fail "partial output for $bad_dir"
done
finish tokenize
