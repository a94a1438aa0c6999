#!/usr/bin/env bash
# Renders a kvaudit HTML report to a PNG with headless Chromium, the way a
# reviewer's browser would show it, and fails if the page logged anything to the
# console (the report has no script, so any console message is a problem: a
# blocked network load, a CSP violation, a parse error).
#
# Usage: tools/render-html.sh REPORT.html OUT.png [DOM_OUT.html]
#   DOM_OUT.html  also write the DOM as Chromium parsed it (--dump-dom)
# Environment:
#   KVAUDIT_CHROMIUM        browser binary (default: chromium)
#   KVAUDIT_CHROMIUM_FLAGS  extra flags, appended (e.g. --disable-dev-shm-usage)
#   KVAUDIT_RENDER_SIZE     window WIDTHxHEIGHT in CSS pixels (default 1200x2400)
#   KVAUDIT_RENDER_DARK=1   render with prefers-color-scheme: dark
#   KVAUDIT_RENDER_TIMEOUT  seconds before giving up (default 90)
# Exit status: 0 rendered cleanly; 2 usage error or no browser; 3 the browser
# failed or wrote no PNG; 4 the page logged console messages (printed on stderr).
set -uo pipefail

if [[ $# -lt 2 || $# -gt 3 ]]; then
  sed -n '2,18p' "$0" >&2
  exit 2
fi
report=$1 png=$2 dom=${3:-}
browser=${KVAUDIT_CHROMIUM:-chromium}
if ! command -v "$browser" >/dev/null 2>&1; then
  echo "render-html: '$browser' not found (install it with tools/install-deps.sh --full)" >&2
  exit 2
fi
if [[ ! -f $report ]]; then
  echo "render-html: $report: no such file" >&2
  exit 2
fi
size=${KVAUDIT_RENDER_SIZE:-1200x2400}
if [[ ! $size =~ ^[0-9]+x[0-9]+$ ]]; then
  echo "render-html: KVAUDIT_RENDER_SIZE must look like 1200x2400, not '$size'" >&2
  exit 2
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/kvaudit-render.XXXXXX")
trap 'rm -rf "$work"' EXIT
report_url="file://$(cd "$(dirname "$report")" && pwd)/$(basename "$report")"

# A fresh profile and everything that would phone home switched off: the render
# must not depend on (or touch) the network.
flags=(--headless --no-sandbox --disable-gpu --disable-background-networking
  --disable-component-update --disable-sync --no-first-run --disable-quic
  --disable-default-apps --disable-extensions --hide-scrollbars --mute-audio
  --force-device-scale-factor=1 "--user-data-dir=$work/profile"
  --enable-logging=stderr --v=0 "--window-size=${size/x/,}" "--screenshot=$work/shot.png")
[[ ${KVAUDIT_RENDER_DARK:-0} == 1 ]] && flags+=(--force-dark-mode)
# shellcheck disable=SC2206  # extra flags are split on blanks on purpose
[[ -n ${KVAUDIT_CHROMIUM_FLAGS:-} ]] && flags+=(${KVAUDIT_CHROMIUM_FLAGS})
[[ -n $dom ]] && flags+=(--dump-dom)

timeout "${KVAUDIT_RENDER_TIMEOUT:-90}" "$browser" "${flags[@]}" "$report_url" \
  >"$work/dom.html" 2>"$work/log.txt"
status=$?
if [[ $status -ne 0 || ! -s $work/shot.png ]]; then
  echo "render-html: $browser exited with status $status and wrote no screenshot; its log:" >&2
  grep -v -e 'dbus' -e 'bluez' "$work/log.txt" | tail -n 20 >&2
  exit 3
fi
cp "$work/shot.png" "$png"
[[ -n $dom ]] && cp "$work/dom.html" "$dom"
# Chromium logs page console output as "...:CONSOLE..." lines.
if grep -E ':CONSOLE|Uncaught' "$work/log.txt" >"$work/console.txt"; then
  echo "render-html: the page logged console messages:" >&2
  cat "$work/console.txt" >&2
  exit 4
fi
exit 0
