#!/usr/bin/env bash
# One directory of many entries (issue 45): listing it and deleting it
# through a zlogfs mount (/dev/fuse), beside ext4 on a loop device, in the
# same run.
#
#   bash bench/bigdir.sh [N]          # N empty files, default 1,000,000
#   RM=0 bash bench/bigdir.sh 100000  # without the rm -rf rows
#
# Prints a Markdown table: seconds for each step on each system, and
# zlogfs's time as a multiple of ext4's. The zlogfs image is made with
# `zlogfs import` (the files are made once in a source directory on the
# host); ext4's by creating the files on it. Caches are dropped before
# each timed step. Needs root (loop and FUSE mounts).
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-1000000}
rm_rows=${RM:-1}
cargo build --release -q
bin=$PWD/target/release/zlogfs
work=$(mktemp -d /var/tmp/zlogfs-bigdir.XXXXXX)
cleanup() {
    fusermount3 -u "$work/zm" 2>/dev/null || true
    umount "$work/em" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/src/big" "$work/zm" "$work/em"
python3 - "$work/src/big" "$n" <<'PY'
import os, sys
d, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    os.close(os.open(os.path.join(d, f"file-{i:08d}"), os.O_CREAT | os.O_WRONLY, 0o644))
PY
t() { local s e; s=$(date +%s.%N); "$@" >/dev/null; e=$(date +%s.%N); awk -v s="$s" -v e="$e" 'BEGIN {print e - s}'; }
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
declare -A z x
drop
z[make]=$(t "$bin" import "$work/src" "$work/z.img" --size 16G)
"$bin" mount "$work/z.img" "$work/zm" -o uring=off
drop
z[list]=$(t sh -c "ls -f '$work/zm/big' | wc -l")
z[list2]=$(t sh -c "ls -f '$work/zm/big' | wc -l")
truncate -s 16G "$work/e.img"
mkfs.ext4 -q -F "$work/e.img"
mount -o loop "$work/e.img" "$work/em"
x[make]=$(t cp -a "$work/src/big" "$work/em/")
umount "$work/em"
mount -o loop "$work/e.img" "$work/em"
drop
x[list]=$(t sh -c "ls -f '$work/em/big' | wc -l")
x[list2]=$(t sh -c "ls -f '$work/em/big' | wc -l")
steps=(make list list2)
if [ "$rm_rows" = 1 ]; then
    drop
    z[rm]=$(t rm -rf "$work/zm/big")
    drop
    x[rm]=$(t rm -rf "$work/em/big")
    steps+=(rm)
fi
fusermount3 -u "$work/zm"
umount "$work/em"
echo "| $n entries in one directory | zlogfs (s) | ext4 (s) | zlogfs / ext4 |"
echo "|---|---:|---:|---:|"
declare -A what=([make]="made (zlogfs import; cp -a onto ext4)" [list]="ls -f, cold" [list2]="ls -f, again" [rm]="rm -rf")
for s in "${steps[@]}"; do
    awk -v w="${what[$s]}" -v a="${z[$s]}" -v b="${x[$s]}" \
        'BEGIN {printf "| %s | %.2f | %.2f | %.1f |\n", w, a, b, (b > 0 ? a / b : 0)}'
done
