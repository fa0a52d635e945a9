#!/usr/bin/env bash
# Space of a volume by codec and chunk size (issue 27): an ext4 image
# holding the linux-source tree copied into a fresh volume with nbdcopy,
# for each CODECS (default "zstd:1 zstd:2 zstd:3 zstd:6") and CHUNKS
# (default "16K 64K"); prints codec, chunk size, the image's live bytes
# after close, and the copy's seconds.
#
#   bash bench/nbd-space.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
need_tools nbdcopy:libnbd-bin
cargo build --release -q
z=$PWD/target/release/zlogfs
tree=$(linux_tree /var/tmp/zlogfs-bench)
work=$(mktemp -d /var/tmp/zlogfs-nbdspace.XXXXXX)
server=""
cleanup() {
    [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null
    mountpoint -q "$work/m" && umount "$work/m"
    rm -rf "$work"
}
trap cleanup EXIT
sock=$work/sock
mkdir -p "$work/m"
ext4_image_of "$tree" "$work/tree.ext4" "$work/m"
echo "| codec | chunk | live bytes | copy (s) |"
echo "|---|---|---:|---:|"
for codec in ${CODECS:-zstd:1 zstd:2 zstd:3 zstd:6}; do
    for chunk in ${CHUNKS:-16K 64K}; do
        rm -f "$work/z.img" "$sock"
        truncate -s 16G "$work/z.img"
        "$z" mkfs "$work/z.img" --size 16G --force --codec "$codec" >/dev/null 2>&1
        "$z" nbd "$work/z.img" --socket "$sock" --create vol:3G --chunk-size "$chunk" 2>/dev/null &
        server=$!
        for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
        t0=$(date +%s.%N)
        nbdcopy "$work/tree.ext4" "nbd+unix:///vol?socket=$sock"
        t1=$(date +%s.%N)
        kill "$server"
        wait "$server" || true
        server=""
        live=$("$z" stats "$work/z.img" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["live_bytes"])')
        echo "| $codec | $chunk | $live | $(python3 -c "print('%.1f' % ($t1 - $t0))") |"
    done
done
