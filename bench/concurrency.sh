#!/usr/bin/env bash
# Requests of several processes at once through the mount (issue 4): does
# one process's long request hold up the others, and do concurrent reads
# and writes keep up? Compares builds side by side in one run.
#
#   bash bench/concurrency.sh                     # the current build
#   BINS="old=/path/to/zlogfs new=target/release/zlogfs" bash bench/concurrency.sh
#
# Each build, ROUNDS times (default 2), in turns, on a fresh 8 GiB image
# with a 1 GiB file written by fio (buffer_compress_percentage=50):
#   - random 4 KiB reads with O_DIRECT (every read reaches the daemon), by
#     1 and by 4 jobs, 10 s each, after a remount with caches dropped;
#   - random 4 KiB overwrites by 4 jobs with an fsync every 32 writes, 10 s,
#     while another process runs `stat FILE; ls DIR` 2000 times: the time
#     those take says how long quick requests wait behind the writers'.
#
# Prints one line per measure and round, and a Markdown table of medians
# to bench/results/concurrency-DATE.md (or OUT). Needs root, fuse3 and fio.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
need_tools fio:fio fusermount3:fuse3
if [ -z "${BINS:-}" ]; then
    cargo build --release -q
    BINS="current=$PWD/target/release/zlogfs"
fi
rounds=${ROUNDS:-2}
work=$(mktemp -d /var/tmp/zlogfs-concurrency.XXXXXX)
mnt=$work/mnt
mkdir -p "$mnt"
trap 'mountpoint -q "$mnt" && umount "$mnt"; rm -rf "$work"' EXIT

drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }
remount() { # bin
    mountpoint -q "$mnt" && umount "$mnt"
    for _ in $(seq 300); do pgrep -f "^$1 mount $work/z.img" >/dev/null || break; sleep 0.05; done
    drop
    "$1" mount "$work/z.img" "$mnt"
}
terse() { fio --output-format=terse --terse-version=3 "$@"; }

declare -A R
for round in $(seq "$rounds"); do
    for b in $BINS; do
        label=${b%%=*} bin=${b#*=}
        echo "== round $round: $label ($bin)" >&2
        mountpoint -q "$mnt" && umount "$mnt"
        rm -f "$work/z.img"
        "$bin" mkfs "$work/z.img" --size 8G >/dev/null
        "$bin" mount "$work/z.img" "$mnt"
        terse --name=fill --filename="$mnt/f" --rw=write --bs=1M --size=1G --end_fsync=1 \
            --buffer_compress_percentage=50 --refill_buffers >/dev/null
        for jobs in 1 4; do
            remount "$bin"
            iops=$(terse --name=r --filename="$mnt/f" --rw=randread --direct=1 --bs=4k --size=1G \
                --numjobs=$jobs --time_based --runtime=10 --group_reporting | cut -d';' -f8)
            echo "$label: random 4 KiB reads, O_DIRECT, $jobs job(s): $iops IOPS" >&2
            R[$label,read$jobs]+=" $iops"
        done
        remount "$bin"
        (
            s=$(date +%s%N)
            for _ in $(seq 2000); do stat "$mnt/f" >/dev/null; ls "$mnt" >/dev/null; done
            e=$(date +%s%N)
            echo $(((e - s) / 1000000)) >"$work/quick"
        ) &
        iops=$(terse --name=w --filename="$mnt/f" --rw=randwrite --bs=4k --size=1G --numjobs=4 \
            --time_based --runtime=10 --group_reporting --fsync=32 \
            --buffer_compress_percentage=50 --refill_buffers | cut -d';' -f49)
        wait
        quick=$(cat "$work/quick")
        echo "$label: random 4 KiB writes, 4 jobs, fsync every 32: $iops IOPS; 2000 stat+ls meanwhile: $quick ms" >&2
        R[$label,write]+=" $iops"
        R[$label,quick]+=" $quick"
        umount "$mnt"
    done
done

out=${OUT:-bench/results/concurrency-$(date +%Y-%m-%d).md}
mkdir -p "$(dirname "$out")"
{
    echo "Machine: $(nproc) cores, kernel $(uname -r); $(date -u +%Y-%m-%dT%H:%MZ); commit $(git rev-parse --short HEAD)"
    echo "Builds: $BINS. Command: ${BINS:+BINS=\"$BINS\" }bash bench/concurrency.sh ($rounds rounds: median, and min-max)"
    echo
    echo "| measure | $(for b in $BINS; do printf '%s | ' "${b%%=*}"; done)"
    echo "|---|$(for _ in $BINS; do printf -- '---:|'; done)"
    for m in read1 read4 write quick; do
        case $m in
        read1) l="random 4 KiB reads, O_DIRECT, 1 job (IOPS)" ;;
        read4) l="random 4 KiB reads, O_DIRECT, 4 jobs (IOPS)" ;;
        write) l="random 4 KiB writes, 4 jobs, fsync every 32 (IOPS)" ;;
        quick) l="2000 × (stat + ls) during those writes (ms)" ;;
        esac
        printf '| %s |' "$l"
        for b in $BINS; do
            read -r med lo hi <<<"$(median_spread <<<"${R[${b%%=*},$m]}")"
            printf ' %s (%s-%s) |' "$med" "$lo" "$hi"
        done
        echo
    done
} | tee "$out"
echo "written to $out" >&2
