#!/usr/bin/env bash
# Two zlogfs builds read one image, in turns: cold find and cold read-back
# (tar | cat) of the linux-source tree, after a mount and dropped caches
# each. For a change that must not slow reads (a restructure): the image
# is the same for both, and alternating spreads the machine's drift over
# both, where bench/fuse.sh copies a new tree in per build and round.
#
#   bash bench/ab-read.sh BEFORE_BIN AFTER_BIN [ROUNDS] [TREE]
#
# BEFORE_BIN imports the tree (both builds must read its format); ROUNDS
# (default 5) pairs. Prints each measurement, then medians with min-max
# and after / before. Needs root and /dev/fuse.
set -euo pipefail
# A failing mount or read inside $(cold ...) stops the run, not a 0.00 s.
shopt -s inherit_errexit
cd "$(dirname "$0")/.."
. bench/lib.sh
need_tools bc:bc
[ $# -ge 2 ] || { echo "usage: bash bench/ab-read.sh BEFORE_BIN AFTER_BIN [ROUNDS] [TREE]" >&2; exit 2; }
declare -A bin=([before]=$(realpath "$1") [after]=$(realpath "$2"))
rounds=${3:-5}
tree=${4:-$(linux_tree /var/tmp/zlogfs-bench)}
work=$(mktemp -d /var/tmp/zlogfs-ab.XXXXXX)
cleanup() {
    findmnt -M "$work/mnt" >/dev/null 2>&1 && fusermount3 -u "$work/mnt"
    rm -rf "$work"
}
trap cleanup EXIT
mkdir "$work/mnt"
"${bin[before]}" import "$tree" "$work/img" --size 8G >/dev/null
# cold BIN COMMAND...: seconds COMMAND takes on a fresh mount by BIN,
# caches dropped.
cold() {
    local b=$1
    shift
    "$b" mount "$work/img" "$work/mnt"
    findmnt -M "$work/mnt" >/dev/null || { echo "$b did not mount $work/img" >&2; exit 1; }
    sync
    echo 3 >/proc/sys/vm/drop_caches
    local t0 t1
    t0=$(date +%s.%N)
    "$@" >/dev/null
    t1=$(date +%s.%N)
    fusermount3 -u "$work/mnt"
    # The daemon closes the image after the unmount returns: wait until
    # the image opens (as bench/fuse.sh does).
    for _ in $(seq 300); do "$b" stats "$work/img" >/dev/null 2>&1 && break; sleep 0.1; done
    printf '%.2f\n' "$(echo "$t1 - $t0" | bc)"
}
declare -A finds tars
for i in $(seq "$rounds"); do
    for l in before after; do
        f=$(cold "${bin[$l]}" find "$work/mnt")
        t=$(cold "${bin[$l]}" bash -o pipefail -c "tar -C '$work/mnt' -cf - . | cat")
        echo "round $i $l: find $f s, tar $t s"
        finds[$l]+="$f "
        tars[$l]+="$t "
    done
done
echo "Machine: $(nproc) cores, kernel $(uname -r); commit $(git rev-parse --short HEAD); before=$1 after=$2; $rounds rounds"
echo
echo "| measure (s) | before | after | after / before (medians) |"
echo "|---|---:|---:|---:|"
for m in find tar; do
    declare -n v=${m}s
    read -r mb lb hb <<<"$(echo "${v[before]}" | median_spread)"
    read -r ma la ha <<<"$(echo "${v[after]}" | median_spread)"
    echo "| $m, cold | $mb ($lb-$hb) | $ma ($la-$ha) | $(printf '%.2f' "$(echo "scale=4; $ma / $mb" | bc)") |"
done
