#!/bin/sh
# Storage engine benchmarks (issue 2): prepares the corpus (the tar of
# Debian's linux-source), runs `cargo bench --bench engine` and writes the
# Markdown output to bench/results/engine-<date>.md (also printed).
#
# Environment (all optional):
#   ZLOGFS_BENCH_CACHE   where the uncompressed tar is kept (/var/tmp/zlogfs-bench)
#   ZLOGFS_BENCH_CORPUS  use this file instead of the linux-source tar
#   ZLOGFS_BENCH_MB, ZLOGFS_BENCH_KEYS, ZLOGFS_BENCH_REPS, ZLOGFS_BENCH_ONLY
#                        see benches/engine.rs (the codec table moved to
#                        benches/papers.rs, run by bench/papers.sh)
#   CARGO_TARGET_DIR     as usual
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${ZLOGFS_BENCH_CACHE:-/var/tmp/zlogfs-bench}
. "$root/bench/lib.sh"

if [ -z "${ZLOGFS_BENCH_CORPUS:-}" ]; then
    ZLOGFS_BENCH_CORPUS=$(linux_tar "$cache" "$(linux_xz)")
    export ZLOGFS_BENCH_CORPUS
fi
run_bench "$root" engine
