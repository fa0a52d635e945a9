#!/usr/bin/env bash
# The compressed block device (issue 27) beside what a user would pick
# instead, in one run, each export on a Unix socket and driven by fio's
# nbd engine: zlogfs (`zlogfs nbd`), `nbdkit file` on a raw image on ext4
# (no compression), and `nbdkit file` on a raw image on btrfs with
# compress=zstd:1 (a compressed VM disk today).
#
#   bash bench/nbd.sh
#
# For each: a volume of SIZE (default 1 GiB) written sequentially with
# fio (1 MiB blocks, buffer_compress_percentage=50), read back
# sequentially, then 4 KiB random reads and writes at queue depth 1 and 32
# (RUNTIME seconds each, default 15); each read test after the server was
# restarted and the page cache dropped (cold, for every system); and the
# space used after storing, in
# a fresh volume, an ext4 image holding the linux-source tree (nbdcopy).
# For zlogfs, the space and the random reads again after
# `zlogfs clean --max-live 1` stored the volume in its cold form
# (the other systems have no such pass: their figures
# are repeated).
# Each host file system lives on its own loop device over a sparse file
# in /var/tmp, as zlogfs's image does. Prints a Markdown table with the
# ratios to `nbdkit file` on btrfs zstd:1, and writes it to
# bench/results/nbd-DATE.md (or OUT). Needs root; installs nbdkit,
# libnbd-bin, fio and btrfs-progs when missing.
#
# SYSTEMS picks the columns (default "zlogfs ext4 btrfs"); zlogfs:SIZE is
# zlogfs with volumes of SIZE chunks (`--chunk-size`), zlogfs:SIZE:UNIT
# also with compression units of UNIT (`--unit`), zlogfs:SIZE:UNIT:COLD
# also with the cold form COLD (`--cold`, / for the space: 512K/zstd:9),
# e.g.
#   SYSTEMS="zlogfs:16K:16K zlogfs:16K:64K zlogfs:16K:128K btrfs" bash bench/nbd.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
need_tools nbdkit:nbdkit nbdcopy:libnbd-bin fio:fio mkfs.btrfs:btrfs-progs
size=${SIZE:-1G}
runtime=${RUNTIME:-15}
cargo build --release -q
z=$PWD/target/release/zlogfs
tree=$(linux_tree /var/tmp/zlogfs-bench)
work=$(mktemp -d /var/tmp/zlogfs-nbdbench.XXXXXX)
mkdir -p "$work/host" "$work/ext4tree"
loop=""
server=""
cleanup() {
    [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null
    mountpoint -q "$work/ext4tree" && umount "$work/ext4tree"
    mountpoint -q "$work/host" && umount "$work/host"
    [ -n "$loop" ] && losetup -d "$loop" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
sock=$work/sock

# The ext4 image holding the tree, made once.
ext4_image_of "$tree" "$work/tree.ext4" "$work/ext4tree"
logical=$(du -sb "$tree" | cut -f1)

. bench/nbd-lib.sh

fio_nbd() { # fio args...: the JSON of one job
    fio --name=b --ioengine=nbd --uri="nbd+unix:///vol?socket=$sock" --output-format=json \
        --buffer_compress_percentage=50 --refill_buffers "$@"
}
# (fio's nbd engine prints a line before the JSON.)
iops() { python3 -c 'import json,sys; s=sys.stdin.read(); j=json.loads(s[s.index("{"):])["jobs"][0]; print("%.0f" % (j["read"]["iops"] + j["write"]["iops"]))'; }
mbps() { python3 -c 'import json,sys; s=sys.stdin.read(); j=json.loads(s[s.index("{"):])["jobs"][0]; print("%.1f" % ((j["read"]["bw_bytes"] + j["write"]["bw_bytes"]) / 1048576))'; }

declare -A R
read -r -a systems <<<"${SYSTEMS:-zlogfs ext4 btrfs}"
for sys in "${systems[@]}"; do
    echo "== $sys" >&2
    # Space: the ext4 image with the tree, in a fresh volume.
    start $sys 3G
    nbdcopy "$work/tree.ext4" "nbd+unix:///vol?socket=$sock"
    # The image is the server's while it runs: stop it first (its
    # close syncs and checkpoints), then count.
    stop_server
    R[$sys,space]=$(used $sys)
    recompress $sys
    R[$sys,spacec]=$(used $sys)
    stop
    # Speed.
    start $sys "$size"
    # end_fsync: the clock stops when the data is durable (an NBD FLUSH),
    # so that a host that compresses at writeback pays inside it too.
    R[$sys,seqw]=$(fio_nbd --rw=write --bs=1M --size="$size" --iodepth=8 --end_fsync=1 | mbps)
    cold $sys
    R[$sys,seqr]=$(fio_nbd --rw=read --bs=1M --size="$size" --iodepth=8 | mbps)
    cold $sys
    R[$sys,rr1]=$(fio_nbd --rw=randread --bs=4k --size="$size" --iodepth=1 --time_based --runtime="$runtime" | iops)
    cold $sys
    R[$sys,rr32]=$(fio_nbd --rw=randread --bs=4k --size="$size" --iodepth=32 --time_based --runtime="$runtime" | iops)
    case $sys in
    zlogfs*)
        stop_server
        recompress $sys
        serve $sys
        cold $sys
        R[$sys,rr1c]=$(fio_nbd --rw=randread --bs=4k --size="$size" --iodepth=1 --time_based --runtime="$runtime" | iops)
        cold $sys
        R[$sys,rr32c]=$(fio_nbd --rw=randread --bs=4k --size="$size" --iodepth=32 --time_based --runtime="$runtime" | iops)
        ;;
    *) R[$sys,rr1c]=${R[$sys,rr1]} R[$sys,rr32c]=${R[$sys,rr32]} ;;
    esac
    R[$sys,rw1]=$(fio_nbd --rw=randwrite --bs=4k --size="$size" --iodepth=1 --time_based --runtime="$runtime" | iops)
    R[$sys,rw32]=$(fio_nbd --rw=randwrite --bs=4k --size="$size" --iodepth=32 --time_based --runtime="$runtime" | iops)
    stop
done

out=${OUT:-bench/results/nbd-$(date -u +%F).md}
{
    echo "Machine: $(nproc) cores, kernel $(uname -r); $(date -u +%Y-%m-%dT%H:%MZ); commit $(git rev-parse --short HEAD)"
    echo "Command: ${SYSTEMS:+SYSTEMS=\"$SYSTEMS\" }${SIZE:+SIZE=$SIZE }${RUNTIME:+RUNTIME=$RUNTIME }bash bench/nbd.sh; volume $size, random tests $runtime s each; fio's nbd engine over a Unix socket; space: an ext4 image holding $(basename "$tree") ($logical bytes of file data) copied in with nbdcopy."
    echo
    table_head "${systems[@]}"
    table_row space "space used (bytes)" "${systems[@]}"
    table_row spacec "space used, zlogfs's volume in its cold form (bytes)" "${systems[@]}"
    table_row seqw "1 MiB sequential write (MiB/s)" "${systems[@]}"
    table_row seqr "1 MiB sequential read (MiB/s)" "${systems[@]}"
    table_row rr1 "4 KiB random read, QD1 (IOPS)" "${systems[@]}"
    table_row rr32 "4 KiB random read, QD32 (IOPS)" "${systems[@]}"
    table_row rr1c "4 KiB random read, QD1, cold form (IOPS)" "${systems[@]}"
    table_row rr32c "4 KiB random read, QD32, cold form (IOPS)" "${systems[@]}"
    table_row rw1 "4 KiB random write, QD1 (IOPS)" "${systems[@]}"
    table_row rw32 "4 KiB random write, QD32 (IOPS)" "${systems[@]}"
} | tee "$out"
echo "written to $out" >&2
