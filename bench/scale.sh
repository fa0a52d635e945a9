#!/usr/bin/env bash
# A large tree of small files (issue 45): zlogfs beside ext4 and btrfs
# (compress=zstd:1) on loop devices, in one run.
#
#   bash bench/scale.sh [N]               # N files (default 1,000,000)
#   PEERS=0 bash bench/scale.sh 10000000  # zlogfs alone
#   TREE=DIR bash bench/scale.sh N        # a tree mktree.py made already
#
# The tree is tests/scale/mktree.py's (directories of 100-1,000 entries,
# half the files under 4 KiB, the rest up to 4 KiB more; seed 17). For
# each system, caches dropped before each timed step (a zlogfs
# mount's daemon's caches too):
#
#   load      zlogfs import (and its peak RSS); cp -a onto ext4 and
#             btrfs (CP=1 adds cp -a through a zlogfs mount: hours at ten
#             million files)
#   tools     zlogfs fsck, stats, du and scrub of the image: seconds and
#             peak RSS
#   mount     clean, and for zlogfs after kill -9 of its daemon
#   find      cold, then warm; du -s cold
#   rm -rf    of the whole tree, then a sync (zlogfs sync on the mount)
#
# Prints a Markdown table: seconds (or MiB) per step and system, and
# zlogfs's time as a multiple of each peer's. Needs root, /dev/fuse, loop
# devices and about 6 KiB of free disk per file for each peer. One
# directory of a million entries is bench/bigdir.sh's.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
n=${1:-1000000}
peers=${PEERS:-1}
need_tools mkfs.btrfs:btrfs-progs
cargo build --release -q
bin=$PWD/target/release/zlogfs
work=$(mktemp -d /var/tmp/zlogfs-scale-bench.XXXXXX)
cleanup() {
    for m in "$work/zm" "$work/em" "$work/bm"; do
        findmnt -M "$m" >/dev/null 2>&1 && { umount "$m" 2>/dev/null || umount -l "$m"; }
    done
    rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/zm" "$work/em" "$work/bm"
tree=${TREE:-}
if [ -z "$tree" ]; then
    tree=$work/tree
    python3 tests/scale/mktree.py "$tree" "$n" 17 4096
fi
n=$(find "$tree" -type f | wc -l)

# The kernel's caches, and a zlogfs mount's daemon's (the kernel's
# drop_caches does not reach them).
drop() {
    sync
    echo 3 > /proc/sys/vm/drop_caches
    if findmnt -M "$work/zm" >/dev/null 2>&1; then
        "$bin" drop-caches "$work/zm" >/dev/null || echo "bench/scale.sh: drop-caches failed" >&2
    fi
}
# secs CMD...: the seconds CMD takes (its output dropped).
# A step that fails ends the run (set -e sees the assignment fail): its
# time would mean nothing.
secs() {
    local s
    s=$(date +%s.%N)
    "$@" >/dev/null || { echo "bench/scale.sh: failed: $*" >&2; return 1; }
    awk -v s="$s" -v e="$(date +%s.%N)" 'BEGIN {printf "%.2f", e - s}'
}
# peak CMD...: seconds and peak RSS (MiB) of CMD, as "S M".
peak() {
    /usr/bin/time -f '%e %M' -o "$work/rss" "$@" >"$work/out" 2>"$work/err" || {
        echo "bench/scale.sh: failed: $*" >&2
        cat "$work/err" >&2
        return 1
    }
    awk '{printf "%.2f %d", $1, $2 / 1024}' "$work/rss"
}
daemon_pid() { pgrep -n -f "zlogfs mount $work/z.img" || true; }
declare -A z e b

# zlogfs
drop
out=$(peak "$bin" import "$tree" "$work/z.img" --size "$((n * 4 / 1024 + 2048))M")
read -r z[load] z[load-rss] <<<"$out"
# The import's summary says what the index wrote, by level.
index_writes=$(grep '^index:' "$work/out" || true)
for t in fsck stats du scrub; do
    drop
    out=$(peak "$bin" $t "$work/z.img")
    read -r z[tool-$t] z[tool-$t-rss] <<<"$out"
done
drop
z[mount]=$(secs "$bin" mount "$work/z.img" "$work/zm" -o uring=off)
z[find]=$(secs find "$work/zm" -type f)
z[find2]=$(secs find "$work/zm" -type f)
drop
z[du]=$(secs du -s "$work/zm")
kill -9 "$(daemon_pid)"
umount -l "$work/zm"
drop
z[mount9]=$(secs "$bin" mount "$work/z.img" "$work/zm" -o uring=off)
drop
z[rm]=$(secs sh -c "rm -rf '$work/zm'/* && '$bin' sync '$work/zm'")
pid=$(daemon_pid)
z[daemon-rss]=$(awk '/^VmHWM/ {printf "%d", $2 / 1024}' "/proc/$pid/status")
umount "$work/zm"
if [ "${CP:-0}" = 1 ]; then
    rm -f "$work/z.img"
    "$bin" mkfs "$work/z.img" --size "$((n * 4 / 1024 + 2048))M" >/dev/null
    "$bin" mount "$work/z.img" "$work/zm" -o uring=off
    drop
    z[cp]=$(secs sh -c "cp -a '$tree/.' '$work/zm/' && '$bin' sync '$work/zm'")
    umount "$work/zm"
fi
rm -f "$work/z.img"

# peer SYSTEM ARRAY MKFS MOUNTOPTS: the same steps on a loop device.
peer() {
    local img=$work/$1.img dir=$work/${1:0:1}m
    local -n r=$2
    truncate -s "$((n * 6 / 1024 + 2048))M" "$img"
    $3 "$img" >/dev/null
    mount -o "loop$4" "$img" "$dir"
    drop
    r[load]=$(secs sh -c "cp -a '$tree/.' '$dir/' && sync")
    r[cp]=${r[load]}
    umount "$dir"
    drop
    r[mount]=$(secs mount -o "loop$4" "$img" "$dir")
    r[find]=$(secs find "$dir" -type f)
    r[find2]=$(secs find "$dir" -type f)
    drop
    r[du]=$(secs du -s "$dir")
    drop
    r[rm]=$(secs sh -c "rm -rf '$dir'/* && sync")
    umount "$dir"
    rm -f "$img"
}
if [ "$peers" = 1 ]; then
    # An inode per 4 KiB: the default (one per 16 KiB) runs out of inodes
    # before a tree of small files fills the disk.
    peer ext4 e "mkfs.ext4 -q -F -i 4096" ""
    peer btrfs b "mkfs.btrfs -q -f" ",compress=zstd:1"
fi

echo "| $n small files | zlogfs | ext4 | btrfs zstd:1 | zlogfs / ext4 | zlogfs / btrfs |"
echo "|---|---:|---:|---:|---:|---:|"
row() {
    local what=$1 k=$2 u=$3
    awk -v w="$what" -v a="${z[$k]:-}" -v x="${e[$k]:-}" -v y="${b[$k]:-}" -v u="$u" '
        function cell(v) { return v == "" ? "-" : v u }
        function ratio(p, q) { return (p == "" || q == "" || q == 0) ? "-" : sprintf("%.2f", p / q) }
        BEGIN { printf "| %s | %s | %s | %s | %s | %s |\n", w, cell(a), cell(x), cell(y), ratio(a, x), ratio(a, y) }'
}
row "load: zlogfs import; cp -a onto ext4, btrfs" load " s"
[ "${CP:-0}" = 1 ] && row "cp -a (zlogfs through the mount)" cp " s"
row "mount" mount " s"
row "mount after kill -9 of the daemon" mount9 " s"
row "find, cold" find " s"
row "find, warm" find2 " s"
row "du -s, cold" du " s"
row "rm -rf, then sync" rm " s"
row "zlogfs import peak RSS" load-rss " MiB"
row "daemon peak RSS" daemon-rss " MiB"
for t in fsck stats du scrub; do
    row "zlogfs $t of the image" "tool-$t" " s"
    row "zlogfs $t peak RSS" "tool-$t-rss" " MiB"
done
if [ -n "$index_writes" ]; then
    echo "zlogfs import: $index_writes"
fi
