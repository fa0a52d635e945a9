#!/bin/sh
# Storage engine benchmarks (issue 2): prepares the corpus (the tar of
# Debian's linux-source), runs `cargo bench --bench engine` and writes the
# Markdown output to bench/results/engine-<date>.md (also printed).
#
# Environment (all optional):
#   ZLOGFS_BENCH_CACHE   where the uncompressed tar is kept (/var/tmp/zlogfs-bench)
#   ZLOGFS_BENCH_CORPUS  use this file instead of the linux-source tar
#   ZLOGFS_BENCH_MB, ZLOGFS_BENCH_TABLE_MB, ZLOGFS_BENCH_SLOW_MB,
#   ZLOGFS_BENCH_KEYS, ZLOGFS_BENCH_REPS, ZLOGFS_BENCH_ONLY
#                        see benches/engine.rs
#   CARGO_TARGET_DIR     as usual
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${ZLOGFS_BENCH_CACHE:-/var/tmp/zlogfs-bench}

if [ -z "${ZLOGFS_BENCH_CORPUS:-}" ]; then
    if ! ls /usr/src/linux-source-*.tar.xz >/dev/null 2>&1; then
        echo "installing linux-source (apt-get)..." >&2
        if [ "$(id -u)" -eq 0 ]; then sudo=; else sudo=sudo; fi
        $sudo apt-get update
        $sudo apt-get install -y linux-source
    fi
    xz=$(ls /usr/src/linux-source-*.tar.xz | sort -V | tail -n 1)
    tar="$cache/$(basename "$xz" .xz)"
    if [ ! -s "$tar" ]; then
        echo "decompressing $xz to $tar..." >&2
        mkdir -p "$cache"
        xz -dc -T0 "$xz" > "$tar.tmp"
        mv "$tar.tmp" "$tar"
    fi
    ZLOGFS_BENCH_CORPUS=$tar
    export ZLOGFS_BENCH_CORPUS
fi

mkdir -p "$root/bench/results"
out="$root/bench/results/engine-$(date +%Y-%m-%d).md"
tmp="$out.tmp"
{
    echo "<!-- $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$root" diff --quiet HEAD -- src 2>/dev/null || echo ' (src modified)'), $(nproc) cores, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1) -->"
    echo
} > "$tmp"
cd "$root"
# Build first so that compiler messages do not interleave with the tables.
cargo bench --bench engine --no-run
{ rc=0; cargo bench --bench engine || rc=$?; echo "$rc" > "$tmp.rc"; } | tee -a "$tmp"
rc=$(cat "$tmp.rc"); rm -f "$tmp.rc"
if [ "$rc" -ne 0 ]; then
    echo "cargo bench failed ($rc); partial output left in $tmp" >&2
    exit "$rc"
fi
mv "$tmp" "$out"
echo "written: $out" >&2
