# Schema validation of kvaudit's --sarif and --junit files, shared by the CI-output shell
# tests (sourced, not a test itself: tests/CMakeLists.txt registers only *.sh). The schemas
# are the ctest fixture ci_schemas' (tools/fetch-ci-schemas.sh); a missing schema or
# validator fails the test, saying how to get it, never skips it.

# require_validators BUILD_DIR: sets SARIF_SCHEMA and JUNIT_XSD, or says what is missing.
require_validators() {
  local schemas=$1/ci-schemas missing=()
  SARIF_SCHEMA=$schemas/sarif-2.1.0-rtm.5.json
  JUNIT_XSD=$schemas/jenkins-junit.xsd
  [[ -f $SARIF_SCHEMA && -f $JUNIT_XSD ]] ||
    missing+=("the schemas in $schemas: run 'tools/fetch-ci-schemas.sh $schemas' (needs npm: make deps-full), or ctest, whose ci_schemas fixture runs it")
  /usr/bin/python3 -c 'import jsonschema' 2> /dev/null ||
    missing+=("the SARIF validator: apt-get install python3-jsonschema (make deps)")
  command -v xmllint > /dev/null || missing+=("the JUnit validator xmllint: apt-get install libxml2-utils (make deps)")
  /usr/bin/python3 -c 'import yaml' 2> /dev/null ||
    missing+=("PyYAML for the workflow and hook files: apt-get install python3-yaml (make deps)")
  if ((${#missing[@]} > 0)); then
    printf 'FAIL: missing %s\n' "${missing[@]}"
    return 1
  fi
}

# validate_sarif FILE: Debian's jsonschema CLI against the SARIF 2.1.0 schema (draft-04).
validate_sarif() {
  local out
  [[ -s $1 ]] || { echo "$1: not written"; return 1; }
  out=$(/usr/bin/python3 -m jsonschema -F '{error.json_path}: {error.message}
' -i "$1" "$SARIF_SCHEMA" 2>&1)
  local status=$?
  if [[ $status -ne 0 || -n $out ]]; then
    echo "$1 fails the SARIF 2.1.0 schema (exit $status): $out"
    return 1
  fi
}

# validate_junit FILE: xmllint against jenkins-junit.xsd.
validate_junit() {
  local out
  [[ -s $1 ]] || { echo "$1: not written"; return 1; }
  out=$(xmllint --noout --schema "$JUNIT_XSD" "$1" 2>&1) || {
    echo "$1 fails jenkins-junit.xsd: $out"
    return 1
  }
}
