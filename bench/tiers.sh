#!/usr/bin/env bash
# Two devices (issue 29): metadata and small files on a fast device, the
# rest on a slow one, against everything on either. The slow device is a
# loop device (direct I/O on a file here) throttled by the cgroup v1 blkio
# controller to a hard disk's limits (IOPS, default 150 reads and writes a
# second; BPS, default 150 MB/s) for the zlogfs daemon, which runs in that
# cgroup; the fast device is a file on the local disk. Three layouts in the
# same run, per tree (the Linux source tree and /usr/include; TREES to
# choose):
#
#   fast  one image file on the local disk
#   slow  one image on the throttled device
#   two   mkfs SLOW --fast FILE: bulk on the throttled device
#
# For each: `cp -a` of the tree in (and `zlogfs sync`), then, each after
# an unmount, dropped caches and a mount (cold): `find`, `find -exec stat`,
# `du -s`, and reading every file under 64 KiB. Seconds, then the two
# layout's times as ratios to the others, the share of physical bytes on
# the fast device, and the fast device's live bytes: how large a fast
# device holds all metadata and small files of the tree (the NVRAM
# study's question). Markdown on stdout; needs root.
#
# WRITE_IOPS (default IOPS; 0: no limit) limits writes apart: this loop
# device is written in 4 KiB requests, so 150 write IOPS is about 0.6 MB/s,
# far below what a disk writes sequentially (the log writes 1 MiB
# batches in order). SMALL sets mkfs --small-file-max for the two layout.
#
#   bash bench/tiers.sh
#   TREES=/usr/include IOPS=100 bash bench/tiers.sh
#   WRITE_IOPS=0 SMALL=16K bash bench/tiers.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
[ "$(id -u)" = 0 ] || { echo "bench/tiers.sh needs root (loop devices, cgroups)" >&2; exit 1; }
cg=/sys/fs/cgroup/blkio/zlogfs-tiers
[ -d /sys/fs/cgroup/blkio ] || { echo "no cgroup v1 blkio controller at /sys/fs/cgroup/blkio" >&2; exit 1; }
cargo build --release -q
z=$PWD/target/release/zlogfs
cache=/var/tmp/zlogfs-bench
trees=${TREES:-"$(linux_tree "$cache") /usr/include"}
iops=${IOPS:-150}
write_iops=${WRITE_IOPS:-$iops}
small=${SMALL:-64K}
bps=${BPS:-150000000}
work=$(mktemp -d /var/tmp/zlogfs-tiers.XXXXXX)
m=$work/m
mkdir -p "$m"
truncate -s "${SLOW_SIZE:-4G}" "$work/slow.raw"
loop=$(losetup --find --show --direct-io=on "$work/slow.raw")
cleanup() {
    mountpoint -q "$m" && { umount "$m" 2>/dev/null || umount -l "$m"; }
    sleep 0.5
    losetup -d "$loop" 2>/dev/null || true
    rmdir "$cg" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
majmin=$(lsblk -dno MAJ:MIN "$loop" | tr -d ' ')
mkdir -p "$cg"
echo "$majmin $iops" >"$cg/blkio.throttle.read_iops_device"
[ "$write_iops" = 0 ] || echo "$majmin $write_iops" >"$cg/blkio.throttle.write_iops_device"
for f in read_bps_device write_bps_device; do echo "$majmin $bps" >"$cg/blkio.throttle.$f"; done

# mk LAYOUT: a fresh image of LAYOUT.
mk() {
    case $1 in
    fast) rm -f "$work/fast.img"; "$z" mkfs "$work/fast.img" --size 4G --history none >/dev/null 2>&1 ;;
    slow) "$z" mkfs "$loop" --force --history none >/dev/null 2>&1 ;;
    two)
        rm -f "$work/fastdev.img"
        "$z" mkfs "$loop" --force --fast "$work/fastdev.img" --fast-size 1G --small-file-max "$small" \
            --history none >/dev/null 2>&1
        ;;
    esac
}
# up LAYOUT: mount it, the daemon in the throttled cgroup.
up() {
    local img opts=""
    case $1 in
    fast) img=$work/fast.img ;;
    slow) img=$loop ;;
    two) img=$loop opts="-o fast=$work/fastdev.img" ;;
    esac
    # shellcheck disable=SC2086 # opts is one option or none
    (echo "$BASHPID" >"$cg/cgroup.procs" && exec "$z" mount $opts "$img" "$m")
}
down() {
    umount "$m"
    for _ in $(seq 100); do pgrep -f "zlogfs mount.* $m\$" >/dev/null || break; sleep 0.1; done
}
cold() { # LAYOUT: unmount, drop every cache, mount
    down
    sync
    echo 3 >/proc/sys/vm/drop_caches
    up "$1"
}
secs() { # COMMAND...: its wall time in seconds
    local t0 t1
    t0=$(date +%s.%N)
    "$@" >/dev/null 2>&1
    t1=$(date +%s.%N)
    python3 -c "print(f'{$t1 - $t0:.2f}')"
}
small_reads() { find "$m" -type f -size -64k -print0 | xargs -0 -r cat; }

for tree in $trees; do
    name=$(basename "$tree")
    files=$(find "$tree" -type f | wc -l)
    bytes=$(du -sb "$tree" | cut -f1)
    echo "### $name ($files files, $((bytes >> 20)) MiB)"
    echo
    echo "| layout | cp -a in (s) | find (s) | find -exec stat (s) | du -s (s) | read files < 64 KiB (s) | on the fast device |"
    echo "|---|---:|---:|---:|---:|---:|---:|"
    declare -A t=()
    for layout in fast slow two; do
        mk "$layout"
        up "$layout"
        t[$layout,cp]=$(secs sh -c "cp -a '$tree' '$m/' && '$z' sync '$m'")
        share=""
        if [ "$layout" = two ]; then
            share=$("$z" stats "$m" --json | python3 -c '
import json, sys
d = json.load(sys.stdin)["devices"]
f, b = d[0]["live_bytes"], d[1]["live_bytes"]
print(f"{100 * f / (f + b):.1f}% ({f / 2**20:.1f} MiB of {(f + b) / 2**20:.1f})")')
        fi
        cold "$layout"
        t[$layout,find]=$(secs find "$m")
        cold "$layout"
        t[$layout,stat]=$(secs find "$m" -exec stat {} +)
        cold "$layout"
        t[$layout,du]=$(secs du -s "$m")
        cold "$layout"
        t[$layout,small]=$(secs small_reads)
        down
        echo "| $layout | ${t[$layout,cp]} | ${t[$layout,find]} | ${t[$layout,stat]} | ${t[$layout,du]} | ${t[$layout,small]} | ${share:-} |"
    done
    ratio() { python3 -c "print(f'{$1 / max($2, 0.01):.2f}')"; }
    echo "| two / fast | $(ratio "${t[two,cp]}" "${t[fast,cp]}") | $(ratio "${t[two,find]}" "${t[fast,find]}") | $(ratio "${t[two,stat]}" "${t[fast,stat]}") | $(ratio "${t[two,du]}" "${t[fast,du]}") | $(ratio "${t[two,small]}" "${t[fast,small]}") | |"
    echo "| slow / two | $(ratio "${t[slow,cp]}" "${t[two,cp]}") | $(ratio "${t[slow,find]}" "${t[two,find]}") | $(ratio "${t[slow,stat]}" "${t[two,stat]}") | $(ratio "${t[slow,du]}" "${t[two,du]}") | $(ratio "${t[slow,small]}" "${t[two,small]}") | |"
    echo
    unset t
done
echo "Throttle: $iops read IOPS, $write_iops write IOPS (0: none), $bps bytes/s each way on $loop (direct I/O), for the zlogfs daemon's cgroup; small-file size $small."
echo "Commit $(git rev-parse --short HEAD), $(date -u +%Y-%m-%d), kernel $(uname -r)." 
