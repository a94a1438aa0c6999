#!/usr/bin/env bash
# Installs every build/test dependency by Debian package name. Idempotent: does
# nothing (and needs no network) when everything is already present.
# Usage: tools/install-deps.sh [--full | --dev]
#   (none)  what `make demo` and `make check` need: build tools, libraries, gtest.
#   --full  adds what the rest of `make test` uses: chromium (the HTML render and browser
#           tests), curl (serve_cli), npm (fetches the SARIF and JUnit schemas the CI-output
#           tests validate against: tools/fetch-ci-schemas.sh), universal-ctags (the
#           function-size limit: tools/house-sizes.sh), clang-tidy (tools/tidy.sh: make test
#           checks the files changed since .tidy-baseline, make tidy every file).
#   --dev   adds the developer tools no test runs: python3-torch for regenerating the tiny
#           models' reference logits and fixture models (tools/torch_reference*.py,
#           tools/train_*.py: their outputs are committed), wrk for tools/bench-serve.sh.
set -euo pipefail
core=(cmake g++ make pkg-config clang-14 libclang-rt-14-dev lld clang-format
      libcli11-dev libfmt-dev nlohmann-json3-dev libsimdjson-dev
      libcpp-httplib-dev libssl-dev libhwy-dev libpcre2-dev libutf8proc-dev
      libgtest-dev libgmock-dev libyaml-cpp-dev libboost-dev libvalijson-dev python3 python3-numpy ccache
      python3-jsonschema libxml2-utils python3-yaml python3-prometheus-client
      dpkg-dev file)  # make deb and shell.install: cpack's dpkg-shlibdeps, and file for ELF
full=(chromium chromium-driver fonts-dejavu-core curl npm
      universal-ctags  # shell.house_sizes: function extents for tools/house-sizes.sh
      clang-tidy)      # tools/tidy.sh, in make test and make tidy
dev=(python3-torch libopenblas0-openmp wrk)
want=("${core[@]}")
case "${1:-}" in
  --full) want+=("${full[@]}") ;;
  --dev) want+=("${full[@]}" "${dev[@]}") ;;
  "") ;;
  *) echo "install-deps: unknown option '$1' (--full or --dev)" >&2; exit 2 ;;
esac
missing=()
for p in "${want[@]}"; do
  # A NodeSource nodejs bundles npm and conflicts with Debian's npm package: any npm will do.
  [[ $p == npm ]] && command -v npm > /dev/null && continue
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then exit 0; fi
echo "install-deps: installing ${missing[*]}" >&2
SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
