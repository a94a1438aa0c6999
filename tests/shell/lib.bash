# The shell tests' one preamble (sourced, not a test: tests/CMakeLists.txt registers only
# *.sh). Each tests/shell/*.sh is called as: script KVAUDIT_BINARY SOURCE_DIR BUILD_DIR and
# starts with
#   source "$(dirname "$0")/lib.bash" "$@"
# which sets kvaudit, root (absolute), build, a scratch folder $work removed at exit (after
# the hooks given to at_exit, e.g. at_exit 'kill "$server_pid"'), and counts checks:
#   pass; fail MESSAGE; ... finish NAME (prints the counts; its status is the test's).
set -uo pipefail
kvaudit=$1
root=$(cd "$2" && pwd)
build=${3:-}
work=$(mktemp -d)
_exit_hooks=()
at_exit() { _exit_hooks+=("$1"); }
_on_exit() {
  local hook
  for hook in "${_exit_hooks[@]}"; do eval "$hook" 2> /dev/null; done
  rm -rf "$work"
}
trap _on_exit EXIT
failures=0
passed=0
pass() { passed=$((passed + 1)); }
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
finish() {
  echo "$1: $passed passed, $failures failed"
  ((failures == 0))
}
