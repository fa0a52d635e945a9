#!/usr/bin/env bash
# Offline model of a volume's space by compression unit and zstd level
# (docs/decisions/2026-11-26-compression-units.md): an ext4 image holding
# the linux-source tree cut into units, all-zero units left out (zlogfs
# stores them as holes), each unit compressed alone with python-zstandard;
# btrfs modelled as 128 KiB zstd:1 extents rounded up to 4 KiB. Prints
# each unit size and level with its bytes and its ratio to the btrfs model.
# UNITS (KiB, default "16 64 128 256 1024") and LEVELS (default "1 2 3 6")
# pick the cells.
#
#   bash bench/unit-model.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
tree=$(linux_tree /var/tmp/zlogfs-bench)
work=$(mktemp -d /var/tmp/zlogfs-unitmodel.XXXXXX)
cleanup() {
    mountpoint -q "$work/m" && umount "$work/m"
    rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/m"
ext4_image_of "$tree" "$work/tree.ext4" "$work/m"
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q zstandard
UNITS=${UNITS:-16 64 128 256 1024} LEVELS=${LEVELS:-1 2 3 6} "$work/venv/bin/python" - "$work/tree.ext4" <<'PY'
import os, sys, zstandard
units = [int(u) << 10 for u in os.environ["UNITS"].split()]
levels = [int(l) for l in os.environ["LEVELS"].split()]
cz = {l: zstandard.ZstdCompressor(level=l) for l in set(levels) | {1}}
tot = {(u, l): 0 for u in units for l in levels}
btrfs = 0
step = max(units + [128 << 10])
with open(sys.argv[1], "rb") as f:
    while buf := f.read(step):
        if buf.count(0) == len(buf):
            continue
        for u in units:
            for o in range(0, len(buf), u):
                c = buf[o:o + u]
                if c.count(0) != len(c):
                    for l in levels:
                        tot[(u, l)] += min(len(cz[l].compress(c)), len(c))
        for o in range(0, len(buf), 128 << 10):
            c = buf[o:o + (128 << 10)]
            if c.count(0) != len(c):
                btrfs += min((len(cz[1].compress(c)) + 4095) // 4096 * 4096, len(c))
print(f"btrfs model (128 KiB zstd:1 extents, 4 KiB rounded): {btrfs} bytes")
print("| unit | level | bytes | / btrfs model |")
print("|---|---|---:|---:|")
for (u, l), v in sorted(tot.items()):
    print(f"| {u >> 10}K | zstd:{l} | {v} | {v / btrfs:.3f} |")
PY
