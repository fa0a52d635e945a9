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
#   threads1   zlogfs mounted with -o threads=1 (default 4). Up to
#              commit 92263a2: one daemon thread takes every request,
#              instead of four taking them in turn (the kernel wakes the
#              one that waited longest). Since: one reader always, and
#              one worker for the long requests instead of four
#   spin       a busy loop at SCHED_IDLE priority on every CPU while the
#              commands run, so that no vCPU ever halts (what the kernel's
#              idle=poll would do); any real work preempts it
#   uring      zlogfs mounted with -o uring: FUSE over io_uring, a queue
#              per CPU (Linux 6.14+; turns the fuse module's enable_uring
#              on, and the run puts it back as it was)
#   dev        -o nouring: /dev/fuse, whose reader spins up to 200 us for
#              the next request during a burst (the default there)
#   dev-nospin -o nouring,spin=0: /dev/fuse, the reader sleeps at once
#
# SETTINGS="..." picks settings (default: as-is, halt-poll where it
# applies, one-cpu). For the copy, the CPU time of cp itself and of the
# zlogfs daemon are reported too: on a machine where both add up to the
# wall time, the gap is work done on the request path, not idle waiting.
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
uring_knob=/sys/module/fuse/parameters/enable_uring
uring_was=$(cat "$uring_knob" 2>/dev/null || echo none)
work=$(mktemp -d /var/tmp/zlogfs-wakeups.XXXXXX)
mnt=$work/mnt
mkdir -p "$mnt"
trap 'spin_stop; mountpoint -q "$mnt" && umount "$mnt"; rm -rf "$work"; [ -w "$knob" ] && echo "$knob_was" >"$knob"; [ -w "$uring_knob" ] && echo "$uring_was" >"$uring_knob"' EXIT

# The knob does something only under the haltpoll cpuidle driver.
driver=$(cat /sys/devices/system/cpu/cpuidle/current_driver 2>/dev/null || echo none)
if [ -n "${SETTINGS:-}" ]; then
    settings=$SETTINGS
elif [ -w "$knob" ] && [ "$driver" = haltpoll ]; then
    settings="as-is halt-poll one-cpu"
else
    settings="as-is one-cpu"
fi
for setting in $settings; do
    case $setting in
    as-is | one-cpu | threads1 | spin | dev | dev-nospin) ;;
    uring) [ -e "$uring_knob" ] || { echo "uring needs FUSE over io_uring (Linux 6.14+)" >&2; exit 1; } ;;
    halt-poll) [ -w "$knob" ] && [ "$driver" = haltpoll ] || { echo "halt-poll needs the haltpoll cpuidle driver (have: $driver)" >&2; exit 1; } ;;
    *) echo "unknown setting $setting (as-is, halt-poll, one-cpu, threads1, spin, uring, dev, dev-nospin)" >&2; exit 1 ;;
    esac
done
spinners=""
spin_start() {
    for c in $(seq 0 $(($(nproc) - 1))); do
        taskset -c "$c" chrt -i 0 sh -c 'while :; do :; done' &
        spinners="$spinners $!"
    done
}
spin_stop() {
    [ -z "$spinners" ] && return
    # shellcheck disable=SC2086 # one word per pid
    kill $spinners 2>/dev/null || true
    wait $spinners 2>/dev/null || true
    spinners=""
}

now() { date +%s%N; }
drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }
daemon_gone() { ! pgrep -f "^$bin mount $work/z.img" >/dev/null; }
mount_sys() { # sys
    case $1 in
    zlogfs) $pin "$bin" mount "$work/z.img" "$mnt" $zopts ;;
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
# daemon_cpu: CPU time (user + system, ms) the zlogfs daemon used so far.
daemon_cpu() {
    local pid
    pid=$(pgrep -f "^$bin mount $work/z.img" | head -n 1)
    awk -v hz="$(getconf CLK_TCK)" '{printf "%.0f", ($14 + $15) * 1000 / hz}' "/proc/$pid/stat"
}

declare -A R
for round in $(seq "$rounds"); do
    for setting in $settings; do
        pin=""
        zopts=""
        [ -w "$knob" ] && echo "$knob_was" >"$knob"
        [ -w "$uring_knob" ] && echo "$uring_was" >"$uring_knob"
        case $setting in
        halt-poll) echo 200000 >"$knob" ;;
        one-cpu) pin="taskset -c 0" ;;
        threads1) zopts="-o threads=1" ;;
        uring) zopts="-o uring" ;;
        dev) zopts="-o nouring" ;;
        dev-nospin) zopts="-o nouring,spin=0" ;;
        esac
        for sys in zlogfs btrfs; do
            echo "== round $round: $setting, $sys" >&2
            make_sys $sys
            mount_sys $sys
            drop
            [ "$setting" = spin ] && spin_start
            d0=0
            [ $sys = zlogfs ] && d0=$(daemon_cpu)
            s=$(now)
            $pin /usr/bin/time -o "$work/time" -f "%U %S" cp -a "$tree/." "$mnt/"
            sync
            e=$(now)
            R[$setting,$sys,cp]+=" $(ms "$s" "$e")"
            R[$setting,$sys,cpcpu]+=" $(awk '{printf "%.0f", ($1 + $2) * 1000}' "$work/time")"
            [ $sys = zlogfs ] && R[$setting,$sys,dcpu]+=" $(($(daemon_cpu) - d0))"
            spin_stop
            umount_sys
            for what in find read; do
                drop
                mount_sys $sys
                [ "$setting" = spin ] && spin_start
                s=$(now)
                case $what in
                find) $pin find "$mnt" >/dev/null ;;
                read) $pin tar -C "$mnt" -cf - . | $pin cat >/dev/null ;;
                esac
                e=$(now)
                spin_stop
                R[$setting,$sys,$what]+=" $(ms "$s" "$e")"
                umount_sys
            done
        done
    done
done
[ -w "$knob" ] && echo "$knob_was" >"$knob"

med() { median_spread; }
out=${OUT:-bench/results/wakeups-$(date +%Y-%m-%d).md}
# A second run on the same day does not overwrite the first.
[ -z "${OUT:-}" ] && [ -e "$out" ] && out=${out%.md}-$(date +%H%M).md
mkdir -p "$(dirname "$out")"
{
    echo "Machine: $(nproc) cores, kernel $(uname -r), cpuidle $(cat /sys/devices/system/cpu/cpuidle/current_driver 2>/dev/null || echo none), guest_halt_poll_ns as-is $knob_was, fuse enable_uring as-is $uring_was; $(date -u +%Y-%m-%dT%H:%MZ); commit $(git rev-parse --short HEAD)"
    echo "Tree: $tree ($(find "$tree" | wc -l) entries). Command: ${SETTINGS:+SETTINGS=\"$SETTINGS\" }bash bench/wakeups.sh $tree ($rounds rounds: median, and min-max, in ms)"
    echo
    echo "| setting | measure | zlogfs (ms) | btrfs zstd:1 (ms) | zlogfs / btrfs |"
    echo "|---|---|---:|---:|---:|"
    for setting in $settings; do
        for what in cp cpcpu dcpu find read; do
            z=$(med <<<"${R[$setting,zlogfs,$what]}")
            b=""
            [ -n "${R[$setting,btrfs,$what]:-}" ] && b=$(med <<<"${R[$setting,btrfs,$what]}")
            awk -v st="$setting" -v w="$what" -v z="$z" -v b="$b" 'BEGIN {
                split(z, Z, " "); split(b, B, " ")
                label["cp"] = "cp -a in + sync"; label["find"] = "find, cold"; label["read"] = "read all back (tar), cold"
                label["cpcpu"] = "cp -a: CPU time of cp (user + sys)"; label["dcpu"] = "cp -a: CPU time of the zlogfs daemon"
                if (b == "")
                    printf "| %s | %s | %d (%d-%d) | | |\n", st, label[w], Z[1], Z[2], Z[3]
                else
                    printf "| %s | %s | %d (%d-%d) | %d (%d-%d) | %.2f |\n", st, label[w], Z[1], Z[2], Z[3], B[1], B[2], B[3], Z[1] / B[1]
            }'
        done
    done
} | tee "$out"
echo "written to $out" >&2
