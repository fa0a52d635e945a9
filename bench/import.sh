#!/usr/bin/env bash
# Import benchmark (issue 3): the unpacked linux-source tree (or the trees
# given as arguments) into zlogfs at default settings, beside the same tree
# on btrfs with compress=zstd:1 and as `tar | zstd -3`, in the same run.
#
#   bash bench/import.sh [TREE...]
#
# Prints one Markdown table row per tree and system: bytes stored (data and
# metadata), ratio (logical file bytes / stored bytes), seconds, files/s.
# Needs root (loop mount for btrfs); installs btrfs-progs, zstd and
# linux-source when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
need_tools mkfs.btrfs:btrfs-progs zstd:zstd
cargo build --release -q
bin=$PWD/target/release/zlogfs
trees=("$@")
[ ${#trees[@]} -gt 0 ] || trees=("$(linux_tree /var/tmp/zlogfs-bench)")
work=$(mktemp -d /var/tmp/zlogfs-bench.XXXXXX)
trap 'umount "$work/mnt" 2>/dev/null || true; rm -rf "$work"' EXIT
echo "| tree | system | logical bytes | stored bytes | ratio | seconds | files/s |"
echo "|---|---|---:|---:|---:|---:|---:|"
for t in "${trees[@]}"; do
    logical=$(find "$t" -type f -printf '%s\n' | awk '{s+=$1} END {print s}')
    files=$(find "$t" | wc -l)
    name=$(basename "$t")
    sync; echo 3 > /proc/sys/vm/drop_caches
    # zlogfs: stored = live bytes of the log after import (data + index).
    s=$(date +%s.%N)
    "$bin" import "$t" "$work/z.img" --size 64G --json > "$work/z.json" 2>/dev/null
    e=$(date +%s.%N)
    stored=$("$bin" stats "$work/z.img" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["live_bytes"])')
    awk -v n="$name" -v l="$logical" -v st="$stored" -v s="$s" -v e="$e" -v f="$files" \
        'BEGIN {printf "| %s | zlogfs (zstd:2, 64 KiB chunks) | %d | %d | %.2f | %.1f | %.0f |\n", n, l, st, l/st, e-s, f/(e-s)}'
    rm -f "$work/z.img"
    # btrfs compress=zstd:1: stored = data + metadata used after sync.
    sync; echo 3 > /proc/sys/vm/drop_caches
    truncate -s 64G "$work/b.img"
    mkfs.btrfs -q "$work/b.img" >/dev/null
    mkdir -p "$work/mnt"
    mount -o loop,compress=zstd:1 "$work/b.img" "$work/mnt"
    s=$(date +%s.%N)
    cp -a "$t" "$work/mnt/"
    sync
    e=$(date +%s.%N)
    btrfs filesystem sync "$work/mnt"
    stored=$(btrfs filesystem df -b "$work/mnt" | awk -F'used=' '/^(Data|Metadata)/ {split($2, a, " "); s += a[1]} END {print s}')
    umount "$work/mnt"
    rm -f "$work/b.img"
    awk -v n="$name" -v l="$logical" -v st="$stored" -v s="$s" -v e="$e" -v f="$files" \
        'BEGIN {printf "| %s | btrfs compress=zstd:1 | %d | %d | %.2f | %.1f | %.0f |\n", n, l, st, l/st, e-s, f/(e-s)}'
    # tar | zstd -3: one solid stream, no random access.
    sync; echo 3 > /proc/sys/vm/drop_caches
    s=$(date +%s.%N)
    stored=$(tar -C "$(dirname "$t")" -cf - "$name" | zstd -3 -q -T0 -c | wc -c)
    e=$(date +%s.%N)
    awk -v n="$name" -v l="$logical" -v st="$stored" -v s="$s" -v e="$e" -v f="$files" \
        'BEGIN {printf "| %s | tar \\| zstd -3 | %d | %d | %.2f | %.1f | %.0f |\n", n, l, st, l/st, e-s, f/(e-s)}'
done
