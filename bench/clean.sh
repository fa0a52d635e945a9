#!/usr/bin/env bash
# Cleaner benchmark (issue 5): steady-state random overwrite of an image
# kept 70% full, zlogfs (FUSE) beside btrfs with compress=zstd:1 on a loop
# device of the same size, in one run.
#
#   bash bench/clean.sh            # SIZE=1G, IO64=2G, IO4=256M
#   SYSTEMS=zlogfs BLOCKS=4k DATA=random bash bench/clean.sh   # a part
#   ZMOUNT=nopatches bash bench/clean.sh   # zlogfs mounted with -o nopatches
#   WARM=512M bash bench/clean.sh          # overwrite 512M (not measured) first
#   READ=1 bash bench/clean.sh             # then read the file back in order, cold
#
# Systems: zlogfs, btrfs (mkfs.btrfs defaults) and btrfs-mixed
# (mkfs.btrfs --mixed, btrfs's layout for small devices). A run that fails
# (btrfs: ENOSPC) is reported as such.
#
# For each kind of data (incompressible, so that 70% of the device is
# live, compression or not; and half compressible, fio's
# buffer_compress_percentage=50), each system and each block size (64 KiB,
# then 4 KiB): a fresh image of SIZE; a file of 70% of SIZE written
# sequentially; unmount; then
# fio randwrite over the whole file with end_fsync, IO64 (64 KiB blocks) or
# IO4 (4 KiB blocks) bytes in all; unmount. Reported: the overwrite's
# throughput, and write amplification = bytes the device took during it
# (zlogfs: its lifetime device-bytes counter; btrfs: the loop device's
# sectors written) / bytes fio wrote. Then `zlogfs clean` runs offline on
# the zlogfs image, and its throughput (segments examined x segment size
# / seconds) is reported. Prints a Markdown table and writes it to
# bench/results/clean-DATE.md. Needs root; installs btrfs-progs, fio and
# fuse3 when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
need_tools mkfs.btrfs:btrfs-progs fio:fio fusermount3:fuse3
cargo build --release -q
bin=$PWD/target/release/zlogfs
SIZE=${SIZE:-1G}
IO64=${IO64:-2G}
IO4=${IO4:-256M}
SYSTEMS=${SYSTEMS:-zlogfs btrfs btrfs-mixed}
BLOCKS=${BLOCKS:-64k 4k}
DATA=${DATA:-random half}
WARM=${WARM:-0}
READ=${READ:-0}
bytes() { numfmt --from=iec "$1"; }
size=$(bytes "$SIZE")
fill=$((size * 7 / 10 / 1048576))M
work=$(mktemp -d /var/tmp/zlogfs-cleanbench.XXXXXX)
mnt="$work/mnt"
mkdir -p "$mnt"
loop=""
cleanup() {
    mountpoint -q "$mnt" && umount "$mnt"
    [ -n "$loop" ] && losetup -d "$loop" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

json() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
zstat() { "$bin" stats "$work/z.img" --json 2>/dev/null | json "d['$1']"; }
zwait() { for _ in $(seq 300); do "$bin" stats "$work/z.img" >/dev/null 2>&1 && return; sleep 0.1; done; }
loop_written() { awk '{print $7 * 512}' "/sys/block/$(basename "$loop")/stat"; }

setup() { # system
    case $1 in
    zlogfs)
        rm -f "$work/z.img"
        "$bin" mkfs "$work/z.img" --size "$SIZE" 2>/dev/null
        ;;
    btrfs | btrfs-mixed)
        [ -n "$loop" ] && losetup -d "$loop"
        rm -f "$work/b.img"
        truncate -s "$SIZE" "$work/b.img"
        loop=$(losetup -f --show "$work/b.img")
        if [ "$1" = btrfs-mixed ]; then mkfs.btrfs -q --mixed "$loop" >/dev/null; else mkfs.btrfs -q "$loop" >/dev/null; fi
        ;;
    esac
}
mnt_sys() { # system
    case $1 in
    zlogfs) "$bin" mount "$work/z.img" "$mnt" ${ZMOUNT:+-o "$ZMOUNT"} ;;
    btrfs*) mount -o compress=zstd:1 "$loop" "$mnt" ;;
    esac
}
umnt_sys() { # system
    umount "$mnt"
    if [ "$1" = zlogfs ]; then zwait; fi
}
written() { # system: bytes the device has taken
    case $1 in
    zlogfs) zstat device_bytes_written ;;
    btrfs*) loop_written ;;
    esac
}

declare -A bw wa rd clean_line
for data in $DATA; do
dopt=(--refill_buffers)
[ $data = half ] && dopt=(--refill_buffers --buffer_compress_percentage=50)
for sys in $SYSTEMS; do
    for bs in $BLOCKS; do
        io=$IO64
        [ "$bs" = 4k ] && io=$IO4
        setup $sys
        mnt_sys $sys
        fio --name=fill --filename="$mnt/f" --size="$fill" --rw=write --bs=1M --ioengine=psync \
            "${dopt[@]}" --end_fsync=1 >/dev/null
        if [ "$WARM" != 0 ]; then
            # Warm-up overwrite, not measured: the measured one starts from
            # segments already worn by overwrites (nearer steady state).
            fio --name=warm --filename="$mnt/f" --size="$fill" --io_size="$WARM" --rw=randwrite --bs=$bs \
                --ioengine=psync "${dopt[@]}" --end_fsync=1 --randseed=2 >/dev/null 2>"$work/fio.err" ||
                head -n 3 "$work/fio.err" >&2
        fi
        umnt_sys $sys
        before=$(written $sys)
        mnt_sys $sys
        if out=$(fio --name=ow --filename="$mnt/f" --size="$fill" --io_size="$io" --rw=randwrite --bs=$bs \
            --ioengine=psync "${dopt[@]}" --end_fsync=1 --randseed=3 --output-format=json 2>"$work/fio.err"); then
            umnt_sys $sys
            after=$(written $sys)
            io_bytes=$(echo "$out" | json "d['jobs'][0]['write']['io_bytes']")
            bw[$data.$sys.$bs]=$(echo "$out" | json "round(d['jobs'][0]['write']['bw_bytes'] / 1e6, 1)")
            wa[$data.$sys.$bs]=$(python3 -c "print(round(($after - $before) / $io_bytes, 2))")
            if [ "$READ" = 1 ]; then
                # What the overwrite left for readers: the whole file read
                # in order, from a cold cache.
                mnt_sys $sys
                sync
                echo 3 >/proc/sys/vm/drop_caches
                rd[$data.$sys.$bs]=$(fio --name=rd --filename="$mnt/f" --size="$fill" --rw=read --bs=1M \
                    --ioengine=psync --output-format=json 2>/dev/null | json "round(d['jobs'][0]['read']['bw_bytes'] / 1e6, 1)")
                umnt_sys $sys
            fi
        else
            umnt_sys $sys
            grep -q 'No space' "$work/fio.err" && bw[$data.$sys.$bs]=ENOSPC || bw[$data.$sys.$bs]=failed
            wa[$data.$sys.$bs]="—"
            head -n 3 "$work/fio.err" >&2
        fi
        echo "$data $sys $bs: ${bw[$data.$sys.$bs]} MB/s, write amplification ${wa[$data.$sys.$bs]}${rd[$data.$sys.$bs]:+, read after ${rd[$data.$sys.$bs]} MB/s}" >&2
        if [ $sys = zlogfs ] && [ $bs = 64k ]; then
            t0=$(date +%s.%N)
            rep=$("$bin" clean "$work/z.img" --max-live 0.95 --json 2>/dev/null)
            t1=$(date +%s.%N)
            seg=$(zstat segment_size)
            examined=$(echo "$rep" | json "d['examined']")
            freed=$(echo "$rep" | json "d['freed']")
            clean_mbs=$(python3 -c "print(round($examined * $seg / 1e6 / ($t1 - $t0), 1))")
            clean_line[$data]="$examined segments examined, $freed freed in $(python3 -c "print(round($t1 - $t0, 2))") s: $clean_mbs MB/s"
            echo "zlogfs clean: ${clean_line[$data]}" >&2
        fi
    done
done
done

ratio() { python3 -c "print(round($1 / $2, 2))" 2>/dev/null || echo "—"; }
date=$(date +%F)
out="bench/results/clean-$date.md"
part=""
if [ "$SYSTEMS $BLOCKS $DATA" != "zlogfs btrfs btrfs-mixed 64k 4k random half" ]; then
    out="bench/results/clean-$date-part.md"
    part=" SYSTEMS='$SYSTEMS' BLOCKS='$BLOCKS' DATA='$DATA'"
fi
[ -n "${ZMOUNT:-}" ] && part="$part ZMOUNT='$ZMOUNT'"
[ "$READ" = 1 ] && part="$part READ=1"
[ "$WARM" != 0 ] && part="$part WARM=$WARM" && warm_note=" (measured after a warm-up randwrite of $WARM, same block size)"
{
    echo "# Cleaner: random overwrite of an image kept 70% full ($date)"
    echo
    echo "Command: \`SIZE=$SIZE IO64=$IO64 IO4=$IO4$part bash bench/clean.sh\`, commit $(git rev-parse --short HEAD)."
    echo "Image $SIZE, file of $fill (random: incompressible; half: buffer_compress_percentage=50), then fio randwrite over it${warm_note:-}."
    echo
    echo "| data | workload | system | MB/s | zlogfs / this | write amplification | read after, MB/s |"
    echo "|---|---|---|---:|---:|---:|---:|"
    for data in $DATA; do
    for bs in $BLOCKS; do
        io=$IO64
        [ "$bs" = 4k ] && io=$IO4
        for sys in $SYSTEMS; do
            echo "| $data | randwrite $bs, $io | $sys | ${bw[$data.$sys.$bs]} | $(ratio "${bw[$data.zlogfs.$bs]}" "${bw[$data.$sys.$bs]}") | ${wa[$data.$sys.$bs]} | ${rd[$data.$sys.$bs]:-—} |"
        done
    done
    done
    echo
    for data in $DATA; do
        [ -n "${clean_line[$data]:-}" ] && echo "Offline \`zlogfs clean\` after the 64k run, $data data: ${clean_line[$data]}."
    done
    true
} | tee "$out"
