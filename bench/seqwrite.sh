#!/usr/bin/env bash
# The codec level's cost and gain (issue 4): for each codec, fio sequential
# write of 1 GiB (bs 1M, end_fsync, buffer_compress_percentage=50,
# refill_buffers) through a zlogfs mount, N runs (default 5), and the space
# an import of TREE takes with it (live bytes of the log) and the import's
# time.
#
#   bash bench/seqwrite.sh [TREE]     # default: the linux-source tree
#   CODECS="zstd:1 zstd:3" N=3 BIN=path/to/zlogfs bash bench/seqwrite.sh
#   BINS="old=path/to/zlogfs new=target/release/zlogfs" IMPORT=0 CODECS=zstd:2 bash bench/seqwrite.sh
#
# BINS compares builds: a row per codec and build, their runs taken in
# turns (so that a slow spell of the machine hits each build alike).
# IMPORT=0 leaves the import out.
#
# Prints a Markdown table (median and min-max of the runs) and writes it to
# bench/results/seqwrite-DATE.md (or OUT). Needs root, fio and fuse3.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
need_tools fio:fio fusermount3:fuse3
if [ -z "${BIN:-}" ] && [ -z "${BINS:-}" ]; then
    cargo build --release -q
    BIN=$PWD/target/release/zlogfs
fi
builds=${BINS:-this=$BIN}
import=${IMPORT:-1}
if [ "$import" = 1 ]; then tree=${1:-$(linux_tree /var/tmp/zlogfs-bench)}; else tree=${1:-none}; fi
codecs=${CODECS:-zstd:1 zstd:2 zstd:3}
n=${N:-5}
work=$(mktemp -d /var/tmp/zlogfs-seqwrite.XXXXXX)
mnt=$work/mnt
mkdir -p "$mnt"
trap 'mountpoint -q "$mnt" && umount "$mnt"; rm -rf "$work"' EXIT

closed() { # wait until the daemon has closed the image
    for _ in $(seq 300); do "$BIN" stats "$work/z.img" >/dev/null 2>&1 && return; sleep 0.1; done
}
med() { median_spread | awk '{printf "%s (%s-%s)", $1, $2, $3}'; }

rows=()
for codec in $codecs; do
    declare -A bws=()
    for i in $(seq "$n"); do
        for b in $builds; do
            BIN=${b#*=}
            echo "== $codec, ${b%%=*}: write $i/$n" >&2
            rm -f "$work/z.img"
            "$BIN" mkfs "$work/z.img" --size 16G --codec "$codec" >/dev/null 2>&1
            "$BIN" mount "$work/z.img" "$mnt"
            sync
            echo 3 >/proc/sys/vm/drop_caches
            bws[$b]+=" $(fio --name=seq --filename="$mnt/fio.dat" --size=1G --bs=1M --ioengine=psync \
                --buffer_compress_percentage=50 --refill_buffers --output-format=json --rw=write --end_fsync=1 |
                python3 -c 'import json,sys; print("%.1f" % (json.load(sys.stdin)["jobs"][0]["write"]["bw_bytes"] / 1048576))')"
            umount "$mnt"
            closed
        done
    done
    for b in $builds; do
        BIN=${b#*=}
        live=- secs=-
        if [ "$import" = 1 ]; then
            echo "== $codec, ${b%%=*}: import $tree" >&2
            rm -f "$work/z.img"
            sync
            echo 3 >/proc/sys/vm/drop_caches
            s=$(date +%s.%N)
            "$BIN" import "$tree" "$work/z.img" --size 16G --codec "$codec" >/dev/null 2>&1
            e=$(date +%s.%N)
            live=$("$BIN" stats "$work/z.img" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["live_bytes"])')
            secs=$(awk -v s="$s" -v e="$e" 'BEGIN {printf "%.2f", e - s}')
        fi
        label=$codec
        [ -n "${BINS:-}" ] && label="$codec, ${b%%=*}"
        rows+=("| $label | $(tr ' ' '\n' <<<"${bws[$b]}" | grep . | med) | $live | $secs |")
    done
    unset bws
done

out=${OUT:-bench/results/seqwrite-$(date +%Y-%m-%d).md}
mkdir -p "$(dirname "$out")"
{
    echo "Machine: $(nproc) cores ($(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)), kernel $(uname -r); $(date -u +%Y-%m-%dT%H:%MZ); commit $(git rev-parse --short HEAD)"
    echo "Command: ${BINS:+BINS=\"$BINS\" }${IMPORT:+IMPORT=$IMPORT }${CODECS:+CODECS=\"$CODECS\" }N=$n bash bench/seqwrite.sh${1:+ $1}"
    echo
    echo "| codec | fio seq write 1 GiB, end_fsync (MiB/s, median of $n) | import of $(basename "$tree"): live bytes | import (s) |" | sed "s/import of none/import (not run)/"
    echo "|---|---:|---:|---:|"
    printf '%s\n' "${rows[@]}"
} | tee "$out"
echo "written to $out" >&2
