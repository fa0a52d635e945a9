#!/usr/bin/env bash
# What a zlogfs mount asks of its daemon: the FUSE requests the kernel
# sends, by opcode (counted with `perf record -e fuse:fuse_request_send`),
# and the CPU time of the command and of the daemon, for
#   cp -a SRC into a fresh image (caches dropped first; then sync + fsync),
#   find, cold (remount, caches dropped) and warm (run again at once),
#   tar of everything, cold.
#
#   bench/fuse-requests.sh [SRC]        # default /usr/include
#   ZLOGFS=/path/to/zlogfs ZLOGFS_COMMIT=abc123 bench/fuse-requests.sh
#                                       # another build (say which)
#
# Prints Markdown and writes it to bench/results/requests-DATE.md (or OUT).
# Needs root; installs fuse3 and linux-perf when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
need_tools fusermount3:fuse3 perf:linux-perf
if [ -z "${ZLOGFS:-}" ]; then
    cargo build --release -q
    ZLOGFS=$PWD/target/release/zlogfs
    built="built from commit $(git rev-parse --short HEAD)"
else
    built="given by ZLOGFS${ZLOGFS_COMMIT:+, built from commit $ZLOGFS_COMMIT}"
fi
src=${1:-/usr/include}
out=${OUT:-bench/results/requests-$(date +%F).md}
work=$(mktemp -d /var/tmp/zlogfs-requests.XXXXXX)
img=$work/img
mnt=$work/mnt
mkdir -p "$mnt"
trap 'mountpoint -q "$mnt" && umount "$mnt"; rm -rf "$work"' EXIT

daemon() { pgrep -f "^$ZLOGFS mount $img" | head -1; }
cpu_ms() { awk '{print ($14 + $15) * 10}' "/proc/$1/stat"; }
mount_fresh() {
    mountpoint -q "$mnt" && umount "$mnt"
    while [ -n "$(daemon)" ]; do sleep 0.1; done
    sync
    echo 3 >/proc/sys/vm/drop_caches
    "$ZLOGFS" mount "$img" "$mnt" >/dev/null
}
# measure NAME CMD: run CMD under perf; one Markdown row of requests by
# opcode, wall time, the command's CPU and the daemon's.
measure() {
    local name=$1 cmd=$2 p d0 d1
    p=$(daemon)
    d0=$(cpu_ms "$p")
    perf record -q -e fuse:fuse_request_send -a -o "$work/perf.data" \
        /usr/bin/time -f "%U %S" -o "$work/time" bash -c "$cmd" >/dev/null 2>&1
    d1=$(cpu_ms "$p")
    local ops total
    ops=$(perf script -i "$work/perf.data" 2>/dev/null | grep -oE 'opcode [0-9]+ \(FUSE_[A-Z_]+\)' |
        sed -E 's/.*FUSE_([A-Z_]+).*/\1/' | sort | uniq -c | sort -rn | awk '{printf "%s%s %s", sep, $2, $1; sep=", "}')
    total=$(perf script -i "$work/perf.data" 2>/dev/null | grep -c 'fuse_request_send' || true)
    read -r u sy <"$work/time"
    local shown=${cmd//$work/\$W}
    printf '| %s | `%s` | %d | %.2f | %d | %s |\n' "$name" "${shown//|/\\|}" "$total" \
        "$(echo "$u + $sy" | bc -l)" $((d1 - d0)) "$ops"
}

{
    echo "# FUSE requests of a zlogfs mount"
    echo
    echo "Binary \`$ZLOGFS\`, $built; kernel $(uname -r); $(nproc) cores; source \`$src\`; $(date -u +%FT%RZ). Command: \`bench/fuse-requests.sh $src\`. \$W is a fresh directory under /var/tmp. Command CPU: user + system time of the command; daemon CPU: the daemon's user + system time while it ran. No wall times: perf's start-up would be most of them (bench/compare times these steps)."
    echo
    echo "| step | command | requests | command CPU s | daemon CPU ms | by opcode |"
    echo "|---|---|---:|---:|---:|---|"
    "$ZLOGFS" mkfs "$img" --size 16G >/dev/null 2>&1
    mount_fresh
    measure "copy in" "cp -a '$src/.' '$mnt/data' && sync && python3 -c \"import os; os.fsync(os.open('$mnt/data', os.O_RDONLY))\""
    mount_fresh
    measure "find, cold" "find '$mnt/data'"
    measure "find, warm" "find '$mnt/data'"
    mount_fresh
    measure "read back, cold" "tar -C '$mnt/data' -cf - . | cat"
} | tee "$out"
echo "written to $out" >&2
