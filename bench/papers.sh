#!/bin/sh
# The seed papers' measurements on our data (benches/papers.rs): installs
# linux-source if missing, keeps its tar (the codec table's corpus, as
# bench/run-engine.sh does) and its unpacked tree in /var/tmp/zlogfs-bench,
# runs `cargo bench --bench papers` and writes the Markdown output to
# bench/results/papers-<date>.md (also printed). Section 5 writes
# bench/results/papers-<date>-filesize.csv and .svg beside it.
#
#   bash bench/papers.sh
#
# Environment (all optional):
#   ZLOGFS_BENCH_CACHE     where the tar and the tree are kept (/var/tmp/zlogfs-bench)
#   ZLOGFS_BENCH_CORPUS    the codec table's corpus instead of the linux-source tar
#   ZLOGFS_PAPERS_TREE     the Linux tree instead of the unpacked linux-source
#   ZLOGFS_PAPERS_MB, ZLOGFS_PAPERS_SUBTREE, ZLOGFS_PAPERS_ZSTD19,
#   ZLOGFS_PAPERS_SMALL_MB, ZLOGFS_PAPERS_CLASS_MB, ZLOGFS_PAPERS_ONLY,
#   ZLOGFS_BENCH_TABLE_MB, ZLOGFS_BENCH_SLOW_MB, ZLOGFS_BENCH_REPS
#                          see benches/papers.rs
#   CARGO_TARGET_DIR       as usual
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${ZLOGFS_BENCH_CACHE:-/var/tmp/zlogfs-bench}
start=$(date +%s)
. "$root/bench/lib.sh"

if [ -z "${ZLOGFS_BENCH_CORPUS:-}" ]; then
    ZLOGFS_BENCH_CORPUS=$(linux_tar "$cache" "$(linux_xz)")
    export ZLOGFS_BENCH_CORPUS
fi
if [ -z "${ZLOGFS_PAPERS_TREE:-}" ]; then
    ZLOGFS_PAPERS_TREE=$(linux_tree "$cache")
    export ZLOGFS_PAPERS_TREE
fi

ZLOGFS_PAPERS_DATE=$(date +%Y-%m-%d)
ZLOGFS_PAPERS_CSV_DIR=${ZLOGFS_PAPERS_CSV_DIR:-$root/bench/results}
export ZLOGFS_PAPERS_DATE ZLOGFS_PAPERS_CSV_DIR
run_bench "$root" papers
echo "$(($(date +%s) - start)) s in all" >&2
