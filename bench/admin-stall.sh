#!/usr/bin/env bash
# Admin commands on a busy mount (issue 45): how long a user's request
# waits while `zlogfs stats`, `du`, `scrub` or `fsck` walks a large tree
# through the mount's control channel.
#
#   TREE=DIR bash bench/admin-stall.sh      # a tree you made (mktree.py)
#   bash bench/admin-stall.sh [N]           # N small files, default 200,000
#   BIN=PATH bash bench/admin-stall.sh      # another build (before/after)
#
# A probe creates a 100-byte file every 10 ms in the mount while each
# command runs (and for 3 s with none, the baseline). Prints a Markdown
# table: the command's seconds, the probe's creates, their median, 99th
# percentile and worst latency, and the daemon's peak RSS at the end. The
# image is made with `zlogfs import`; caches are dropped before each
# command. Needs root (FUSE mounts, drop_caches).
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-200000}
if [ -z "${BIN:-}" ]; then
    cargo build --release -q
    BIN=$PWD/target/release/zlogfs
fi
work=$(mktemp -d /var/tmp/zlogfs-stall.XXXXXX)
cleanup() {
    fusermount3 -u "$work/mnt" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/mnt"
tree=${TREE:-}
if [ -z "$tree" ]; then
    tree=$work/tree
    python3 tests/scale/mktree.py "$tree" "$n" 17 4096 >/dev/null
fi
"$BIN" import "$tree" "$work/img" --size 16G >/dev/null
"$BIN" mount "$work/img" "$work/mnt"
pid=$(pgrep -f "zlogfs mount $work/img" | head -n 1)
mkdir "$work/mnt/probe"

# probe SECONDS-FILE: creates files until SECONDS-FILE exists; prints
# "creates median p99 worst" (milliseconds).
probe() {
    python3 - "$work/mnt/probe" "$1" <<'PY'
import os, sys, time
d, stop = sys.argv[1], sys.argv[2]
lat = []
while not os.path.exists(stop):
    t = time.perf_counter()
    with open(os.path.join(d, f"f{len(lat)}-{os.getpid()}"), "w") as f:
        f.write("x" * 100)
    lat.append(time.perf_counter() - t)
    time.sleep(0.01)
lat.sort()
q = lambda p: lat[min(len(lat) - 1, int(len(lat) * p))] * 1e3
print(f"{len(lat)} {q(0.5):.2f} {q(0.99):.1f} {lat[-1] * 1e3:.0f}")
PY
}

echo "| command on the mount | seconds | probe creates | median ms | p99 ms | worst ms |"
echo "|---|---:|---:|---:|---:|---:|"
for cmd in none stats du scrub fsck; do
    sync
    echo 3 >/proc/sys/vm/drop_caches
    rm -f "$work/stop"
    probe "$work/stop" >"$work/probe.out" &
    p=$!
    sleep 1
    s=$(date +%s.%N)
    case $cmd in
    none) sleep 3 ;;
    *) "$BIN" "$cmd" "$work/mnt" >/dev/null ;;
    esac
    e=$(date +%s.%N)
    touch "$work/stop"
    wait "$p"
    read -r creates med p99 worst <"$work/probe.out"
    secs=$(awk -v s="$s" -v e="$e" 'BEGIN {printf "%.2f", e - s}')
    echo "| $cmd | $secs | $creates | $med | $p99 | $worst |"
done
echo
echo "daemon peak RSS: $(awk '/VmHWM/ {print $2 " KiB"}' "/proc/$pid/status")"
