#!/usr/bin/env bash
# What keeping history costs (issue 28): the same overwrites on a mount
# with no automatic points, and with every commit kept for an hour (then
# hourly for two days, daily for 31 days). A 256 MiB file of real data
# (the start of the Linux source tar) on a 1 GiB image, then fio's random
# 64 KiB overwrites of it, about half compressible, an fsync every 16, for
# RUNTIME seconds (default 30). Per POLICIES (default "none
# all:1h,hourly:2d,daily:31d"): fio's write MiB/s, device bytes per user
# byte over the image's life, stored bytes held for history, the points
# kept, and index bytes, from `zlogfs stats` and `zlogfs snapshot list`
# on the mount. Markdown on stdout.
#
#   bash bench/history.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
need_tools fio:fio
cargo build --release -q
z=$PWD/target/release/zlogfs
cache=/var/tmp/zlogfs-bench
tar=$(linux_tar "$cache" "$(linux_xz)")
work=$(mktemp -d /var/tmp/zlogfs-history.XXXXXX)
cleanup() {
    mountpoint -q "$work/m" && { fusermount3 -u "$work/m" 2>/dev/null || umount -l "$work/m"; }
    rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/m"
head -c 256M "$tar" > "$work/data"
runtime=${RUNTIME:-30}
echo "| policy | fio write MiB/s | device bytes per user byte | held for history (MiB) | points kept | index bytes |"
echo "|---|---:|---:|---:|---:|---:|"
for policy in ${POLICIES:-none all:1h,hourly:2d,daily:31d}; do
    rm -f "$work/z.img"
    "$z" mkfs "$work/z.img" --size ${SIZE:-1G} --history "$policy" >/dev/null 2>&1
    "$z" mount "$work/z.img" "$work/m" -f 2>/dev/null &
    daemon=$!
    for _ in $(seq 100); do mountpoint -q "$work/m" && break; sleep 0.1; done
    cp "$work/data" "$work/m/f"
    sync -f "$work/m/f" 2>/dev/null || python3 -c "import os,sys; fd=os.open(sys.argv[1], os.O_RDONLY); os.fsync(fd)" "$work/m/f"
    bw=$(fio --name=ow --filename="$work/m/f" --size=256M --rw=randwrite --bs=64k --fsync=16 \
        --buffer_compress_percentage=50 --refill_buffers --runtime="$runtime" --time_based \
        --output-format=json 2>/dev/null | python3 -c 'import json,sys; print("%.1f" % (json.load(sys.stdin)["jobs"][0]["write"]["bw"] / 1024))')
    "$z" sync "$work/m" >/dev/null
    stats=$("$z" stats "$work/m" --json)
    points=$("$z" snapshot list "$work/m" --json | python3 -c 'import json,sys; print(sum(1 for s in json.load(sys.stdin)["snapshots"] if s.get("automatic")))')
    echo "$stats" | python3 -c '
import json, sys
s = json.load(sys.stdin)
policy, bw, points = sys.argv[1:4]
amp = s.get("device_bytes_per_user_byte") or 0
held = s.get("snapshot_held_bytes", 0) / 2**20
idx = s.get("index_bytes", 0)
print(f"| {policy} | {bw} | {amp:.2f} | {held:.1f} | {points} | {idx} |")
' "$policy" "$bw" "$points"
    fusermount3 -u "$work/m" 2>/dev/null || umount "$work/m"
    # The next mount serves the same control socket: this daemon must be gone.
    wait "$daemon"
done
