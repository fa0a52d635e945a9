#!/usr/bin/env bash
# Where the time of a FUSE round trip goes on a virtual machine (issue 4).
#
#   bash bench/wakeups.sh [TREE]        # default /usr/include, ROUNDS=3
#
# cp -a of TREE in + sync, then a cold find and a cold read-back
# (tar | cat), each after a remount with caches dropped, on zlogfs (FUSE)
# and on btrfs compress=zstd:1 (loop device), under three settings:
#
#   as-is      the machine's own settings
#   halt-poll  guest_halt_poll_ns=200000: an idle vCPU polls for 200 us
#              before it halts, so waking a process on it costs no VM exit
#   one-cpu    every process of the run on CPU 0 (taskset -c 0): the
#              command and the zlogfs daemon, so that a request and its
#              reply wake a process on the same vCPU
#
# A FUSE request wakes the daemon, and its reply wakes the caller: two
# wakeups per request, each of a process that may sit on another vCPU,
# halted. btrfs serves the same calls in the caller's own context. If the
# gap between the two closes under halt-poll or one-cpu, it is made of
# those wakeups, not of zlogfs's own work.
#
# Prints medians (min-max) and the zlogfs/btrfs ratio of medians, and
# writes them to bench/results/wakeups-DATE.md (or OUT). Needs root, a KVM
# guest with the haltpoll cpuidle driver for the halt-poll rows (skipped
# otherwise), btrfs-progs and fuse3.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
need_tools mkfs.btrfs:btrfs-progs fusermount3:fuse3
cargo build --release -q
bin=$PWD/target/release/zlogfs
tree=${1:-/usr/include}
rounds=${ROUNDS:-3}
knob=/sys/module/haltpoll/parameters/guest_halt_poll_ns
knob_was=$(cat "$knob" 2>/dev/null || echo none)
work=$(mktemp -d /var/tmp/zlogfs-wakeups.XXXXXX)
mnt=$work/mnt
mkdir -p "$mnt"
trap 'mountpoint -q "$mnt" && umount "$mnt"; rm -rf "$work"; [ -w "$knob" ] && echo "$knob_was" >"$knob"' EXIT

settings="as-is one-cpu"
# The knob does something only under the haltpoll cpuidle driver.
driver=$(cat /sys/devices/system/cpu/cpuidle/current_driver 2>/dev/null || echo none)
[ -w "$knob" ] && [ "$driver" = haltpoll ] && settings="as-is halt-poll one-cpu"

now() { date +%s%N; }
drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }
daemon_gone() { ! pgrep -f "^$bin mount $work/z.img" >/dev/null; }
mount_sys() { # sys
    case $1 in
    zlogfs) $pin "$bin" mount "$work/z.img" "$mnt" ;;
    btrfs) mount -o loop,compress=zstd:1 "$work/b.img" "$mnt" ;;
    esac
}
umount_sys() {
    umount "$mnt"
    for _ in $(seq 300); do daemon_gone && break; sleep 0.05; done
}
make_sys() { # sys
    rm -f "$work"/*.img
    case $1 in
    zlogfs) "$bin" mkfs "$work/z.img" --size 8G >/dev/null 2>&1 ;;
    btrfs) truncate -s 8G "$work/b.img" && mkfs.btrfs -q "$work/b.img" >/dev/null ;;
    esac
}
ms() { awk -v s="$1" -v e="$2" 'BEGIN {printf "%.0f", (e - s) / 1e6}'; }

declare -A R
for round in $(seq "$rounds"); do
    for setting in $settings; do
        pin=""
        [ -w "$knob" ] && echo "$knob_was" >"$knob"
        case $setting in
        halt-poll) echo 200000 >"$knob" ;;
        one-cpu) pin="taskset -c 0" ;;
        esac
        for sys in zlogfs btrfs; do
            echo "== round $round: $setting, $sys" >&2
            make_sys $sys
            mount_sys $sys
            drop
            s=$(now)
            $pin cp -a "$tree/." "$mnt/"
            sync
            e=$(now)
            R[$setting,$sys,cp]+=" $(ms "$s" "$e")"
            umount_sys
            for what in find read; do
                drop
                mount_sys $sys
                s=$(now)
                case $what in
                find) $pin find "$mnt" >/dev/null ;;
                read) $pin tar -C "$mnt" -cf - . | $pin cat >/dev/null ;;
                esac
                e=$(now)
                R[$setting,$sys,$what]+=" $(ms "$s" "$e")"
                umount_sys
            done
        done
    done
done
[ -w "$knob" ] && echo "$knob_was" >"$knob"

med() { median_spread; }
out=${OUT:-bench/results/wakeups-$(date +%Y-%m-%d).md}
mkdir -p "$(dirname "$out")"
{
    echo "Machine: $(nproc) cores, kernel $(uname -r), cpuidle $(cat /sys/devices/system/cpu/cpuidle/current_driver 2>/dev/null || echo none), guest_halt_poll_ns as-is $knob_was; $(date -u +%Y-%m-%dT%H:%MZ); commit $(git rev-parse --short HEAD)"
    echo "Tree: $tree ($(find "$tree" | wc -l) entries). Command: bash bench/wakeups.sh $tree ($rounds rounds: median, and min-max, in ms)"
    echo
    echo "| setting | measure | zlogfs (ms) | btrfs zstd:1 (ms) | zlogfs / btrfs |"
    echo "|---|---|---:|---:|---:|"
    for setting in $settings; do
        for what in cp find read; do
            z=$(med <<<"${R[$setting,zlogfs,$what]}")
            b=$(med <<<"${R[$setting,btrfs,$what]}")
            awk -v st="$setting" -v w="$what" -v z="$z" -v b="$b" 'BEGIN {
                split(z, Z, " "); split(b, B, " ")
                label["cp"] = "cp -a in + sync"; label["find"] = "find, cold"; label["read"] = "read all back (tar), cold"
                printf "| %s | %s | %d (%d-%d) | %d (%d-%d) | %.2f |\n", st, label[w], Z[1], Z[2], Z[3], B[1], B[2], B[3], Z[1] / B[1]
            }'
        done
    done
} | tee "$out"
echo "written to $out" >&2
