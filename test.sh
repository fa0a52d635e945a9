#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit and randomised engine tests
# (model, crash at every I/O operation, I/O-error loop, corruption), the
# CLI end to end, and a short run of every fuzz target.
# Randomised tests print their seed; replay one with ZLOGFS_SEED=<seed>.
set -euo pipefail
cd "$(dirname "$0")"

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy -D warnings"
cargo clippy --all-targets -- -D warnings
echo "== cargo test"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test --all-targets 2>&1 | tee "$log"
if [ "${ZLOGFS_SKIP_FUZZ:-0}" != 1 ]; then
    echo "== fuzz (${FUZZ_SECONDS:-20} s per target)"
    bash .ci/fuzz.sh
fi
# One closing line for the whole run (the fuzz output comes after cargo's).
passed=$(grep -E '^test result:' "$log" | grep -oE '[0-9]+ passed' | awk '{s += $1} END {print s + 0}')
failed=$(grep -E '^test result:' "$log" | grep -oE '[0-9]+ failed' | awk '{s += $1} END {print s + 0}')
echo "tests: $passed passed, $failed failed"
