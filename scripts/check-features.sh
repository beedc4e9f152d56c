#!/usr/bin/env bash
# Every feature of every workspace crate builds alone: for each package,
# `cargo check` with no features, then with each feature on its own (no
# default features). Libraries and binaries only; one target dir, so each
# check after the first rebuilds only what the feature changes. A warning
# counts as a failure.
set -euo pipefail
cd "$(dirname "$0")/.."

# "package feature" lines; "package" alone for the no-feature build.
combos=$(cargo metadata --format-version 1 --no-deps | python3 -c '
import json, sys
meta = json.load(sys.stdin)
members = set(meta["workspace_members"])
for pkg in sorted(meta["packages"], key=lambda p: p["name"]):
    if pkg["id"] not in members:
        continue
    print(pkg["name"])
    for feature in sorted(pkg["features"]):
        if feature != "default":
            print(pkg["name"], feature)
')

failed=()
while read -r package feature; do
  if [ -z "${feature:-}" ]; then
    echo "== $package (no features)"
    args=(--no-default-features)
  else
    echo "== $package --features $feature"
    args=(--no-default-features --features "$feature")
  fi
  # Warnings fail too (a feature leaving an import unused), read from the
  # output rather than with RUSTFLAGS, which would rebuild every dependency.
  if ! out=$(cargo check --quiet -p "$package" "${args[@]}" 2>&1) || grep -q '^warning' <<<"$out"; then
    printf '%s\n' "$out"
    failed+=("$package ${feature:-(no features)}")
  fi
done <<<"$combos"

if [ ${#failed[@]} -gt 0 ]; then
  printf 'does not build alone: %s\n' "${failed[@]}"
  exit 1
fi
echo "every feature of every crate builds alone"
