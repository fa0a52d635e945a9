#!/usr/bin/env bash
# Fuzz every on-disk decoder of zlogfs, and the NBD server, for a short time.
#
#   .ci/fuzz.sh                       # each target for $FUZZ_SECONDS (default 20)
#   FUZZ_SECONDS=300 .ci/fuzz.sh      # longer
#   FUZZ_TARGETS="fuzz_codec fuzz_block" .ci/fuzz.sh   # a subset
#
# Builds all targets once (nightly, release, debug assertions on so integer
# overflow panics too), writes seed corpora under fuzz/corpus/, runs each
# target, prints one line per target and exits non-zero if any target
# crashed (a panic, an assertion, a sanitizer report, an OOM or a timeout).
# Crashing inputs are left in fuzz/artifacts/<target>/.
set -euo pipefail

cd "$(dirname "$0")/.."

FUZZ_SECONDS="${FUZZ_SECONDS:-20}"
ALL_TARGETS="fuzz_superblock fuzz_checkpoint_slot fuzz_batch fuzz_block fuzz_codec fuzz_run_blocks fuzz_checkpoint_body fuzz_journal fuzz_nbd"
FUZZ_TARGETS="${FUZZ_TARGETS:-$ALL_TARGETS}"
# Same flags for build and run, or `cargo fuzz run` rebuilds.
FUZZ_FLAGS=(-O --debug-assertions)

if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi
rustup toolchain list | grep -q nightly || rustup toolchain install nightly --profile minimal

echo "== building fuzz targets"
cargo +nightly fuzz build "${FUZZ_FLAGS[@]}"

host="$(rustc +nightly -vV | sed -n 's/^host: //p')"
"fuzz/target/$host/release/gen_seeds" fuzz/corpus

logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT
failed=()
for t in $FUZZ_TARGETS; do
    log="$logs/$t.log"
    if cargo +nightly fuzz run "${FUZZ_FLAGS[@]}" "$t" -- \
        -max_total_time="$FUZZ_SECONDS" -rss_limit_mb=2048 -print_final_stats=1 >"$log" 2>&1; then
        status=ok
    else
        status=FAILED
        failed+=("$t")
    fi
    # libFuzzer ends with "Done N runs in S second(s)".
    stats="$(sed -n 's/^Done \([0-9]*\) runs in \([0-9]*\) second.*/\1 \2/p' "$log" | tail -n1)"
    if [ -n "$stats" ]; then
        set -- $stats
        secs=$(( $2 > 0 ? $2 : 1 ))
        cov="$(grep -o 'cov: [0-9]*' "$log" | tail -n1 || true)"
        echo "$t: $status ($1 runs in $2 s, $(( $1 / secs )) exec/s, $cov)"
    else
        echo "$t: $status"
    fi
    if [ "$status" != ok ]; then
        # The panic's message comes before a long stack trace.
        echo "---- what failed in the $t log:"
        grep -m 3 -A 3 -E "panicked at|ERROR: libFuzzer|out-of-memory" "$log" || true
        echo "---- last lines of the $t log:"
        tail -n 60 "$log"
        echo "---- crashing inputs:"
        ls -l "fuzz/artifacts/$t/" 2>/dev/null || true
    fi
done

if [ "${#failed[@]}" -ne 0 ]; then
    echo "fuzzing found problems in: ${failed[*]}"
    echo "reproduce with: cargo +nightly fuzz run ${FUZZ_FLAGS[*]} <target> fuzz/artifacts/<target>/<file>"
    exit 1
fi
echo "all fuzz targets ran clean for ${FUZZ_SECONDS} s each"
