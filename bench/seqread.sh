#!/usr/bin/env bash
# Sequential read through a zlogfs mount, builds compared in turns: each
# build writes a 1 GiB file (fio, bs 1M, buffer_compress_percentage=50,
# refill_buffers, end_fsync) into its own image; then, N rounds (default
# 5), each build is mounted, the page cache dropped, and the file read
# with fio (bs 1M).
#
#   BINS="old=/tmp/zlogfs-old new=target/release/zlogfs" bash bench/seqread.sh
#   OPTS=nouring N=3 bash bench/seqread.sh        # this tree's build only
#
# OPTS are the mount options (default: uring). Prints a Markdown table
# (median and min-max, MiB/s) and writes it to bench/results/seqread-DATE.md
# (or OUT). Needs root, fio and fuse3.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
need_tools fio:fio fusermount3:fuse3
if [ -z "${BINS:-}" ]; then
    cargo build --release -q
    BINS="this=$PWD/target/release/zlogfs"
fi
n=${N:-5}
opts=${OPTS:-uring}
out=${OUT:-bench/results/seqread-$(date +%F).md}
work=$(mktemp -d /var/tmp/zlogfs-seqread.XXXXXX)
mnt=$work/mnt
mkdir -p "$mnt"
trap 'mountpoint -q "$mnt" && umount "$mnt"; rm -rf "$work"' EXIT

declare -A bin runs
names=()
for b in $BINS; do
    names+=("${b%%=*}")
    bin[${b%%=*}]=${b#*=}
done
mnt_as() { # name
    "${bin[$1]}" mount -o "$opts" "$work/$1.img" "$mnt"
}
unmount() {
    umount "$mnt"
    # The daemon syncs and closes the image after the unmount.
    for _ in $(seq 300); do "${bin[$1]}" stats "$work/$1.img" >/dev/null 2>&1 && return; sleep 0.1; done
}
for b in "${names[@]}"; do
    "${bin[$b]}" mkfs --size 4G "$work/$b.img" >/dev/null
    mnt_as "$b"
    fio --name=w --filename="$mnt/f" --rw=write --bs=1M --size=1G --buffer_compress_percentage=50 \
        --refill_buffers --end_fsync=1 --output-format=terse >/dev/null
    unmount "$b"
done
for r in $(seq "$n"); do
    for b in "${names[@]}"; do
        mnt_as "$b"
        sync
        echo 3 >/proc/sys/vm/drop_caches
        bw=$(fio --name=r --filename="$mnt/f" --rw=read --bs=1M --size=1G --output-format=json |
            python3 -c 'import json,sys; print(round(json.load(sys.stdin)["jobs"][0]["read"]["bw"]/1024))')
        echo "round $r, $b: $bw MiB/s" >&2
        runs[$b]="${runs[$b]:-} $bw"
        unmount "$b"
    done
done
{
    echo "fio sequential read of 1 GiB (bs 1M) through \`-o $opts\`, $n rounds in turns, $(date +%F), $(uname -r)"
    echo
    echo "| build | MiB/s, median (min-max) |"
    echo "|---|---|"
    for b in "${names[@]}"; do
        # shellcheck disable=SC2086
        echo "| $b | $(printf '%s\n' ${runs[$b]} | median_spread | awk '{printf "%s (%s-%s)", $1, $2, $3}') |"
    done
} | tee "$out"
