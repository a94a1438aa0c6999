#!/usr/bin/env bash
# The demo's HTML report (kvaudit check on the motivating NVFP4 checkpoint, SGLang,
# TP 8) and a quant report with charts, rendered in headless Chromium: no console
# messages, a non-blank PNG, and the DOM Chromium built holds every finding, fact,
# table and chart (with every series) that the same command's --json lists.
# Chromium is required (tools/install-deps.sh --full); KVAUDIT_SKIP_BROWSER=1 skips.
# Usage: html_render.sh KVAUDIT_BINARY SOURCE_DIR BUILD_DIR
source "$(dirname "$0")/lib.bash" "$@"
set -e  # a command that fails (the demo checkpoint, a render) fails the test
source_dir=$root
build_dir=$build
if [[ "${KVAUDIT_SKIP_BROWSER:-}" == 1 ]]; then
  echo "html_render: skipped (KVAUDIT_SKIP_BROWSER=1)"
  exit 0
fi
out="$build_dir/html_render"
mkdir -p "$out"

# The same sparse, headers-only checkpoint `make demo` builds.
generated=$("$source_dir/tools/ensure-demo-checkpoint.sh" "$build_dir")

# Renders $1.html, then checks the DOM against $1.json.
render_and_check() {
  local name="$1" size="$2"
  KVAUDIT_RENDER_SIZE="$size" bash "$source_dir/tools/render-html.sh" \
    "$out/$name.html" "$out/$name.png" "$work/$name.dom.html" 2>"$work/$name.log" ||
    fail "$name: tools/render-html.sh exit $? (2: no chromium; 3: browser failed; 4: console messages): $(cat "$work/$name.log")"
  local png_bytes
  png_bytes=$(stat -c %s "$out/$name.png")
  ((png_bytes > 40000)) || fail "$name: PNG is only $png_bytes bytes (blank page?)"
  /usr/bin/python3 - "$out/$name.json" "$work/$name.dom.html" "$name" <<'PY'
import html, json, sys
report = json.load(open(sys.argv[1], encoding="utf-8"))
dom = open(sys.argv[2], encoding="utf-8").read()
name = sys.argv[3]
problems = []
def need(text, what):
    if text not in dom:
        problems.append(f"{what}: {text!r} not in the rendered DOM")
def attr(value):
    return html.escape(value, quote=True).replace("&#x27;", "'")
need('<section class="verdict sev-%s"' % report["verdict_severity"], "verdict")
for finding in report["findings"]:
    need('data-finding-id="%s" data-severity="%s"' % (attr(finding["id"]), finding["severity"]), "finding")
for key in report["facts"]:
    need('<tr data-fact="%s">' % attr(key), "fact")
for table in report["tables"]:
    need('data-table-id="%s"' % attr(table["id"]), "table")
for chart in report["charts"]:
    start = dom.find('data-chart-id="%s" data-chart-kind="%s"' % (attr(chart["id"]), chart["kind"]))
    if start < 0:
        problems.append("chart %s: no <svg> in the rendered DOM" % chart["id"])
        continue
    svg = dom[start:dom.find("</svg>", start)]
    for index, series in enumerate(chart["series"]):
        if 'data-series="%s" data-series-index="%d"' % (attr(series["name"]), index) not in svg:
            problems.append("chart %s: series %r missing" % (chart["id"], series["name"]))
        marks = sum(1 for y in series["y"] if y is not None)
        if chart["kind"] == "lines" and not chart["log_y"]:
            group = svg[svg.find('data-series-index="%d"' % index):]
            group = group[:group.find("</g>")]
            if group.count("<circle") != marks:
                problems.append("chart %s: series %r has %d markers for %d values" %
                                (chart["id"], series["name"], group.count("<circle"), marks))
if problems:
    print("\n".join(problems), file=sys.stderr)
    sys.exit(1)
print(f"{name}: {len(report['findings'])} findings, {len(report['facts'])} facts, "
      f"{len(report['tables'])} tables, {len(report['charts'])} charts "
      f"({sum(len(c['series']) for c in report['charts'])} series) found in the rendered page")
PY
}

# 1. The demo: `kvaudit check --kv-policy lossless` exits 1 (critical finding: FP8 KV without scales).
status=0
"$kvaudit" check "$generated" --engine sglang --tp 8 --kv-policy lossless --html "$out/demo-check.html" --json \
  >"$out/demo-check.json" || status=$?
[[ $status -eq 1 ]] || fail "demo check: expected exit 1 (critical finding), got $status"
render_and_check demo-check 1200x1800

# 2. A report with charts: what FP8/NVFP4 do to attention, on synthetic outlier keys.
"$kvaudit" quant --formats fp8_e4m3:none,fp8_e4m3:tensor,nvfp4 --synthetic outlier-keys \
  --ctx 1k,4k --queries 4 --threads 2 --html "$out/quant.html" --json >"$out/quant.json" ||
  fail "quant exited $?"
/usr/bin/python3 -c 'import json,sys; sys.exit(0 if json.load(open(sys.argv[1]))["charts"] else 1)' \
  "$out/quant.json" || fail "quant report has no charts to check"
render_and_check quant 1200x2400
echo "html_render: PNGs in $out"
finish html_render
