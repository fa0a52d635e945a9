#!/usr/bin/env bash
# Mounted file system benchmark (issue 4): zlogfs through FUSE beside btrfs
# (loop device, compress=zstd:1) and ext4 (loop device), in one run, on
# the unpacked linux-source tree and a 1 GiB fio file
# (buffer_compress_percentage=50).
#
#   bash bench/fuse.sh [TREE]
#
# For each system: cp -a of the tree in, then sync (and an fsync, which
# commits everything on zlogfs); find and find -exec stat, read everything
# back (tar | cat), each after a remount and dropping caches, so that no
# cache of the kernel or of zlogfs is warm; fio sequential write of 1 GiB
# with end_fsync, then sequential read after a remount; space used (btrfs:
# data + metadata used; ext4: blocks used; zlogfs: live bytes of the log).
# ROUNDS rounds (default 3); prints a Markdown table of medians with their
# spread, each also as a ratio to btrfs zstd:1, and writes it to
# bench/results/fuse-DATE.md (or OUT). Needs root; installs
# btrfs-progs, fio, fuse3 and linux-source when missing.
#
# URING=Y|N sets the fuse module's enable_uring for the run (and restores
# it after): zlogfs mounts with its default, -o uring=auto, so Y measures
# FUSE over io_uring and N the /dev/fuse transport. Without URING, the
# machine's setting stands; the header of the results names it.
#
# HALT_POLL_NS=N sets the guest's haltpoll knob
# (/sys/module/haltpoll/parameters/guest_halt_poll_ns) for the run and
# restores it after: on a KVM guest that halts an idle vCPU at once (N=0),
# every wakeup of a process on the other vCPU is a VM exit, and a FUSE
# request makes two of them. Every system runs under the same setting;
# the header of the results names it.
#
# BINS="LABEL=PATH ..." measures several zlogfs builds in the same run, in
# turns within each round (for example the commit before a change and
# after it: BINS="before=/tmp/old/zlogfs after=target/release/zlogfs"); a
# column each, and the ratio of the last to the first beside the peers'
# spread. PEERS="btrfs ext4" (the default) names the other systems; PEERS=
# leaves them out.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
need_tools mkfs.btrfs:btrfs-progs fio:fio fusermount3:fuse3
# BIN=path/to/zlogfs measures another build (default: this tree's, built).
if [ -n "${BIN:-}" ]; then
    bin=$(realpath "$BIN")
else
    cargo build --release -q
    bin=$PWD/target/release/zlogfs
fi
declare -A zbin
labels=()
if [ -n "${BINS:-}" ]; then
    for b in $BINS; do
        labels+=("${b%%=*}")
        zbin[${b%%=*}]=$(realpath "${b#*=}")
    done
else
    labels=(zlogfs)
    zbin[zlogfs]=$bin
fi
systems=()
for l in "${labels[@]}"; do systems+=("z:$l"); done
peers=${PEERS-btrfs ext4}
for p in $peers; do systems+=("$p"); done
tree=${1:-$(linux_tree /var/tmp/zlogfs-bench)}
name=$(basename "$tree")
work=$(mktemp -d /var/tmp/zlogfs-fusebench.XXXXXX)
mnt="$work/mnt"
mkdir -p "$mnt"
poll_knob=/sys/module/haltpoll/parameters/guest_halt_poll_ns
poll_was=$(cat "$poll_knob" 2>/dev/null || echo none)
uring_knob=/sys/module/fuse/parameters/enable_uring
uring_was=$(cat "$uring_knob" 2>/dev/null || echo none)
trap 'mountpoint -q "$mnt" && umount "$mnt"; rm -rf "$work"; [ -n "${HALT_POLL_NS:-}" ] && [ -w "$poll_knob" ] && echo "$poll_was" >"$poll_knob"; [ -n "${URING:-}" ] && [ -w "$uring_knob" ] && echo "$uring_was" >"$uring_knob"' EXIT
if [ -n "${URING:-}" ]; then
    [ -w "$uring_knob" ] || { echo "URING: $uring_knob is missing (no FUSE over io_uring in this kernel: Linux 6.14+)" >&2; exit 1; }
    echo "$URING" >"$uring_knob"
fi
if [ -n "${HALT_POLL_NS:-}" ]; then
    [ -w "$poll_knob" ] || { echo "HALT_POLL_NS: $poll_knob is missing or not writable (not a KVM guest with haltpoll?)" >&2; exit 1; }
    echo "$HALT_POLL_NS" >"$poll_knob"
fi

now() { date +%s.%N; }
drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }

zb() { echo "${zbin[${1#z:}]}"; } # the binary of zlogfs system z:LABEL
mount_sys() { # system
    case $1 in
    z:*) "$(zb "$1")" mount "$work/z.img" "$mnt" ;;
    btrfs) mount -o loop,compress=zstd:1 "$work/b.img" "$mnt" ;;
    ext4) mount -o loop "$work/e.img" "$mnt" ;;
    esac
}
umount_sys() { # system
    umount "$mnt"
    if [ "${1%%:*}" = z ]; then # the daemon closes the image after the unmount
        for _ in $(seq 300); do "$(zb "$1")" stats "$work/z.img" >/dev/null 2>&1 && break; sleep 0.1; done
    fi
}
make_sys() { # system
    rm -f "$work"/*.img
    case $1 in
    z:*) "$(zb "$1")" mkfs "$work/z.img" --size 16G 2>/dev/null ;;
    btrfs) truncate -s 16G "$work/b.img" && mkfs.btrfs -q "$work/b.img" >/dev/null ;;
    ext4) truncate -s 16G "$work/e.img" && mkfs.ext4 -q "$work/e.img" ;;
    esac
}
used() { # system: bytes stored, data and metadata
    case $1 in
    z:*) "$(zb "$1")" stats "$work/z.img" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["live_bytes"])' ;;
    btrfs)
        mount_sys btrfs
        btrfs filesystem df -b "$mnt" | awk -F'used=' '/^(Data|Metadata|System)/ {split($2, a, " "); s += a[1]} END {print s}'
        umount_sys btrfs
        ;;
    ext4)
        mount_sys ext4
        df -B1 --output=used "$mnt" | tail -n 1
        umount_sys ext4
        ;;
    esac
}
timed() { # system what command...: remount cold, run, print seconds
    local sys=$1
    shift
    umount_sys "$sys"
    drop
    mount_sys "$sys"
    local s e
    s=$(now)
    "$@" >/dev/null
    e=$(now)
    awk -v s="$s" -v e="$e" 'BEGIN {printf "%.2f", e - s}'
}

declare -A R
logical=$(find "$tree" -type f -printf '%s\n' | awk '{s+=$1} END {print s}')
files=$(find "$tree" | wc -l)
fio_common=(--name=seq --filename="$mnt/fio.dat" --size=1G --bs=1M --ioengine=psync
    --buffer_compress_percentage=50 --refill_buffers --output-format=json)
rounds=${ROUNDS:-3}
for round in $(seq "$rounds"); do
for sys in "${systems[@]}"; do
    echo "== round $round: $sys" >&2
    make_sys $sys
    mount_sys $sys
    drop
    s=$(now)
    cp -a "$tree" "$mnt/"
    sync
    sync "$mnt/$name" # fsync: zlogfs commits and syncs everything
    e=$(now)
    R[$sys,cp]+=" "$(awk -v s="$s" -v e="$e" 'BEGIN {printf "%.2f", e - s}')
    R[$sys,find]+=" "$(timed $sys find "$mnt/$name")
    R[$sys,stat]+=" "$(timed $sys find "$mnt/$name" -exec stat --format=%s {} +)
    R[$sys,read]+=" "$(timed $sys sh -c "tar -C '$mnt' -cf - '$name' | cat")
    umount_sys $sys
    R[$sys,space]+=" "$(used $sys)
    mount_sys $sys
    R[$sys,write]+=" "$(fio "${fio_common[@]}" --rw=write --end_fsync=1 |
        python3 -c 'import json,sys; print("%.1f" % (json.load(sys.stdin)["jobs"][0]["write"]["bw_bytes"] / 1048576))')
    umount_sys $sys
    drop
    mount_sys $sys
    R[$sys,readseq]+=" "$(fio "${fio_common[@]}" --rw=read |
        python3 -c 'import json,sys; print("%.1f" % (json.load(sys.stdin)["jobs"][0]["read"]["bw_bytes"] / 1048576))')
    umount_sys $sys
done
done

# The median of the rounds; the spread (min-max) beside it.
med() { median_spread; }
out=${OUT:-bench/results/fuse-$(date +%Y-%m-%d).md}
mkdir -p bench/results
{
    echo "Machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), kernel $(uname -r); $(date -u +%Y-%m-%dT%H:%MZ); commit $(git rev-parse --short HEAD)${BIN:+, zlogfs binary $BIN}${BINS:+, zlogfs binaries $BINS}"
    echo "Tree: $name, $files entries, $logical bytes of file data. Command: ${BINS:+BINS=\"$BINS\" }${PEERS+PEERS=\"$PEERS\" }${URING:+URING=$URING }${HALT_POLL_NS:+HALT_POLL_NS=$HALT_POLL_NS }bash bench/fuse.sh ($rounds rounds: median, and min-max)"
    echo "cpuidle: $(cat /sys/devices/system/cpu/cpuidle/current_driver 2>/dev/null || echo none), guest_halt_poll_ns $(cat "$poll_knob" 2>/dev/null || echo none), fuse enable_uring $(cat "$uring_knob" 2>/dev/null || echo none) during the run"
    echo
    name_of() { case $1 in z:*) echo "${1#z:}" ;; btrfs) echo "btrfs zstd:1" ;; *) echo "$1" ;; esac; }
    head="| measure |"
    rule="|---|"
    for sys in "${systems[@]}"; do head+=" $(name_of "$sys") |"; rule+="---:|"; done
    first=z:${labels[0]}
    last=z:${labels[${#labels[@]} - 1]}
    [ "$first" != "$last" ] && { head+=" ${last#z:} / ${first#z:} (medians) |"; rule+="---:|"; }
    [[ " $peers " == *" btrfs "* ]] && { head+=" ${last#z:} / btrfs (medians) |"; rule+="---:|"; }
    echo "$head"
    echo "$rule"
    row() { # key label unit: median (min-max) of each system, ratios of medians
        local line="| $2 ($3) |" m f=0 l=0 b=0
        for sys in "${systems[@]}"; do
            m=$(med <<<"${R[$sys,$1]}")
            line+=$(awk -v m="$m" 'BEGIN { split(m, M, " "); printf " %.10g (%.10g-%.10g) |", M[1], M[2], M[3] }')
            [ "$sys" = "$first" ] && f=${m%% *}
            [ "$sys" = "$last" ] && l=${m%% *}
            [ "$sys" = btrfs ] && b=${m%% *}
        done
        ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf " %.2f |", (b > 0 ? a / b : 0) }'; }
        [ "$first" != "$last" ] && line+=$(ratio "$l" "$f")
        [[ " $peers " == *" btrfs "* ]] && line+=$(ratio "$l" "$b")
        echo "$line"
    }
    row cp "cp -a in + sync" s
    row find "find, cold" s
    row stat "find -exec stat, cold" s
    row read "read all back (tar), cold" s
    row space "space used" bytes
    row write "fio seq write 1 GiB, end_fsync" MiB/s
    row readseq "fio seq read 1 GiB, cold" MiB/s
} | tee "$out"
echo "written to $out" >&2
