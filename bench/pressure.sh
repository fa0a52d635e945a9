#!/usr/bin/env bash
# A mount's daemon giving its caches back (issue 45): its RSS once reads
# filled the caches, after `zlogfs drop-caches`, and after memory
# pressure made by a loop in a 64 MiB memory cgroup (a reader of the
# tree, and 60 MiB that with Python itself go over the limit: OOM-killed
# in turn), which the daemon's PSI trigger sees.
#
#   TREE=DIR bash bench/pressure.sh   # a tree to import (default: 20,000
#                                     # files of tests/scale/mktree.py)
#   SECS=15 ...                       # seconds of pressure
#
# Needs root, /dev/fuse, PSI (/proc/pressure/memory) and the memory
# cgroup controller (version 1 at /sys/fs/cgroup/memory, or version 2).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q
bin=$PWD/target/release/zlogfs
work=$(mktemp -d /var/tmp/zlogfs-pressure.XXXXXX)
cg=
hog=
cleanup() {
    if [ -n "$hog" ]; then kill "$hog" 2>/dev/null || true; fi
    if [ -n "$cg" ]; then
        # What is left in the cgroup (a reader, an allocation) goes too.
        xargs -r kill 2>/dev/null <"$cg/cgroup.procs" || true
        for _ in 1 2 3 4 5; do rmdir "$cg" 2>/dev/null && break; sleep 0.2; done
    fi
    umount "$work/m" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/m"
tree=${TREE:-}
if [ -z "$tree" ]; then
    tree=$work/tree
    python3 tests/scale/mktree.py "$tree" 20000 17 4096
fi
secs=${SECS:-15}
"$bin" import "$tree" "$work/z.img" --size 8G >/dev/null
rss() { awk '/^VmRSS/ {printf "%d MiB", $2 / 1024}' "/proc/$pid/status"; }
caches() { "$bin" stats "$work/m" --json | python3 -c 'import json,sys; v=json.load(sys.stdin); print("block cache", v["block_cache_bytes"] >> 20, "MiB, index cache", v["index_cache_bytes"] >> 20, "MiB")'; }
# Read the whole tree through the mount (the kernel's caches dropped
# first, so that the reads reach the daemon); the caches' figures are
# read before the daemon's size, which then counts the walk stats makes.
fill() {
    sync
    echo 3 >/proc/sys/vm/drop_caches
    tar cf - -C "$work/m" . | wc -c >/dev/null
    local c
    c=$(caches)
    echo "read the tree: $c; daemon $(rss)"
}

"$bin" mount "$work/z.img" "$work/m" -o uring=off,log=info,logfile="$work/log"
pid=$(pgrep -n -f "mount $work/z.img")
echo "mounted: daemon $(rss)"
fill
"$bin" drop-caches "$work/m"
for s in 1 2 3; do sleep 1; echo "drop-caches +$s s: daemon $(rss)"; done

fill
if [ -d /sys/fs/cgroup/memory ]; then
    cg=/sys/fs/cgroup/memory/zlogfs-pressure
    mkdir -p "$cg"
    echo $((64 << 20)) >"$cg/memory.limit_in_bytes"
else
    cg=/sys/fs/cgroup/zlogfs-pressure
    mkdir -p "$cg"
    echo $((64 << 20)) >"$cg/memory.max"
fi
(
    echo "$BASHPID" >"$cg/cgroup.procs"
    end=$((SECONDS + secs))
    while [ "$SECONDS" -lt "$end" ]; do
        tar cf - -C "$tree" . 2>/dev/null | cat >/dev/null || true
        python3 -c 'b = bytearray(60 << 20)' 2>/dev/null || true
    done
) 2>/dev/null &
hog=$!
for i in $(seq "$secs"); do sleep 1; echo "pressure +$i s: $(head -1 /proc/pressure/memory); daemon $(rss)"; done
wait "$hog" || true
echo "after: daemon $(rss); $(caches)"
grep 'memory pressure: freed' "$work/log" || echo "the daemon logged no drop"
"$bin" stats "$work/m" --latency | grep pressure || echo "no pressure.drop_caches counted"
