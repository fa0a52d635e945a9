#!/usr/bin/env bash
# The cost of one FUSE request: `stat` of a file through a zlogfs mount
# with attr_timeout=0 (so every stat is a GETATTR round trip), COUNT stats
# (default 20000) in one Python process, ROUNDS times (default 3), for
# each transport setting:
#   dev-nospin  /dev/fuse, the reader sleeps between requests (-o nouring,spin=0)
#   dev         /dev/fuse, the reader spins during bursts (-o nouring)
#   uring       FUSE over io_uring (-o uring; turns the fuse module's
#               enable_uring on)
#
#   bash bench/roundtrip.sh
#   SETTINGS="dev uring" COUNT=5000 bash bench/roundtrip.sh
#
# Prints a Markdown table (µs per stat: median and min-max of the rounds)
# and writes it to bench/results/roundtrip-DATE.md (or OUT). Needs root
# and fuse3.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
need_tools fusermount3:fuse3 python3:python3
if [ -z "${BIN:-}" ]; then
    cargo build --release -q
    BIN=$PWD/target/release/zlogfs
fi
settings=${SETTINGS:-dev-nospin dev uring}
count=${COUNT:-20000}
rounds=${ROUNDS:-3}
out=${OUT:-bench/results/roundtrip-$(date +%F).md}
work=$(mktemp -d /var/tmp/zlogfs-roundtrip.XXXXXX)
mnt=$work/mnt
mkdir -p "$mnt"
trap 'mountpoint -q "$mnt" && umount "$mnt"; rm -rf "$work"' EXIT
"$BIN" mkfs "$work/z.img" >/dev/null
closed() { # wait until the daemon has closed the image
    for _ in $(seq 300); do "$BIN" stats "$work/z.img" >/dev/null 2>&1 && return; sleep 0.1; done
}
rows=()
for s in $settings; do
    case $s in
        dev-nospin) o=nouring,spin=0 ;;
        dev) o=nouring ;;
        uring) o=uring ;;
        *) echo "unknown setting $s" >&2; exit 2 ;;
    esac
    r=()
    for _ in $(seq "$rounds"); do
        "$BIN" mount -o "$o,attr_timeout=0,entry_timeout=0" "$work/z.img" "$mnt"
        touch "$mnt/f"
        us=$(python3 - "$mnt/f" "$count" <<'PY'
import os, sys, time
p, n = sys.argv[1], int(sys.argv[2])
os.stat(p)
t = time.perf_counter()
for _ in range(n):
    os.stat(p)
print(round((time.perf_counter() - t) / n * 1e6, 1))
PY
)
        echo "$s: $us µs per stat" >&2
        r+=("$us")
        umount "$mnt"
        closed
    done
    rows+=("| $s | $(printf '%s\n' "${r[@]}" | median_spread | awk '{printf "%s (%s-%s)", $1, $2, $3}') |")
done
{
    echo "Machine: $(nproc) cores, kernel $(uname -r); $(date -u +%FT%RZ); commit $(git rev-parse --short HEAD)"
    echo "Command: SETTINGS=\"$settings\" COUNT=$count ROUNDS=$rounds bash bench/roundtrip.sh"
    echo
    echo "| setting | µs per stat (GETATTR round trip), median (min-max) |"
    echo "|---|---:|"
    printf '%s\n' "${rows[@]}"
} | tee "$out"
