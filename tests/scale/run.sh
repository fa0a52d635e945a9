#!/usr/bin/env bash
# Scale (issue 45): a tree of small files through an image of small
# segments and packs, so that the index reaches many full runs (a run
# holds about 47,000 keys at 256 KiB segments, 754,974 at the default
# 4 MiB: the merge paths of an image of tens of millions of files) in a
# minute.
#
#   import   `zlogfs import` of tests/scale/mktree.py's tree must finish
#            (issue 45: it spun in the merge loop for ever at this size)
#   walk     `find` through the mount names every file
#   delete   `rm -rf` of the whole tree through the mount
#   fsck     of the image, clean, after the import and after the delete
#   memory   peak RSS of the import, of fsck, stats, du and scrub on the
#            image (from the kernel's rusage, /usr/bin/time) and of the
#            mount's daemon
#            (/proc/PID/status VmHWM) under their bounds below
#
# The index's run count is printed after each step (the automatic merges
# lower it only where a merge can: full runs stay, see
# docs/decisions/2026-12-01-merges-that-lower-the-run-count.md). Root
# and /dev/fuse needed (skipped with a note elsewhere, failed under CI).
#
# The image is 8 GiB of 256 KiB segments: 32,768 segments, whose usage
# table alone outgrew a checkpoint body of one block (64 KiB here) before
# checkpoints came in parts (FORMAT.md §3.5).
#
#   bash tests/scale/run.sh                 # 200,000 files, 8 GiB image
#   SCALE_FILES=1000000 bash tests/scale/run.sh
#   SCALE_SIZE=2G SCALE_SEED=1 bash tests/scale/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
files=${SCALE_FILES:-200000}
# Bounds, in MiB: what issue 45 asks at ten million files for fsck, with
# room for the caches (32 MiB of index, 16 of data) of the others, and the
# daemon's default caches (256 MiB index, 128 MiB data, memtables).
fsck_mib=256
tool_mib=192
daemon_mib=1024
# The import: the engine's default caches (256 MiB index, 128 MiB data),
# memtables and a batch of 64 MiB of file data; not the tree (issue 45: it
# held every entry's name and metadata, 1.29 GiB at 3 million files).
import_mib=640
if [ "$(id -u)" != 0 ] || [ ! -e /dev/fuse ] || ! command -v /usr/bin/time >/dev/null; then
    [ "${CI:-}" = true ] && { echo "tests/scale/run.sh needs root, /dev/fuse and /usr/bin/time under CI" >&2; exit 1; }
    echo "note: tests/scale/run.sh needs root, /dev/fuse and /usr/bin/time: skipped"
    exit 0
fi
. tests/lib/zlogfs-bin.sh
work=$(mktemp -d /var/tmp/zlogfs-scale.XXXXXX)
img=$work/img
mnt=$work/mnt
mkdir -p "$mnt"
cleanup() {
    findmnt -M "$mnt" >/dev/null 2>&1 && umount "$mnt"
    rm -rf "$work"
}
trap cleanup EXIT
bad=0
ok() { echo "ok: $*"; }
fail() { echo "FAILED: $*" >&2; bad=1; }
runs() { "$zlogfs" stats --json "$1" | python3 -c 'import json, sys; j = json.load(sys.stdin); print(j["index_runs"], "(by level:", *j["index_runs_by_level"], end=")\n")'; }

python3 tests/scale/mktree.py "$work/tree" "$files" "${SCALE_SEED:-$RANDOM}" 8192
start=$SECONDS
if timeout 600 /usr/bin/time -f '%M' -o "$work/rss" "$zlogfs" import "$work/tree" "$img" --size "${SCALE_SIZE:-8G}" --segment-size 256K --pack-size 64K >"$work/import.log" 2>&1; then
    ok "import of $files files in $((SECONDS - start)) s ($(tail -1 "$work/import.log")); index runs: $(runs "$img")"
    mib=$(($(cat "$work/rss") / 1024))
    if [ "$mib" -le "$import_mib" ]; then ok "import: peak $mib MiB (bound $import_mib)"; else fail "import: peak $mib MiB, past its bound of $import_mib"; fi
else
    fail "import of $files files did not finish in 600 s (or failed):"
    tail -5 "$work/import.log" >&2
    exit 1
fi
rm -rf "$work/tree"

# Peak RSS of each whole-image tool, in MiB.
for t in fsck stats du scrub; do
    bound=$tool_mib
    [ "$t" = fsck ] && bound=$fsck_mib
    if /usr/bin/time -f '%M' -o "$work/rss" "$zlogfs" "$t" "$img" >"$work/$t.out" 2>&1; then
        mib=$(($(tail -1 "$work/rss") / 1024))
        if [ "$mib" -le "$bound" ]; then ok "$t: peak $mib MiB (bound $bound)"; else fail "$t: peak $mib MiB, past its bound of $bound"; fi
    else
        fail "$t on the imported image:"
        tail -5 "$work/$t.out" >&2
    fi
done

# fsck in little memory: many passes (over spans of inode numbers and of
# segments), the same verdict, within less.
if /usr/bin/time -f '%M' -o "$work/rss" "$zlogfs" fsck --memory 4M "$img" >"$work/fsck-small.out" 2>&1 &&
    grep -q "passes over the inodes" "$work/fsck-small.out"; then
    mib=$(($(tail -1 "$work/rss") / 1024))
    ok "fsck --memory 4M: clean, $(grep -o '[0-9]* passes over the inodes, [0-9]* over the blocks' "$work/fsck-small.out"), peak $mib MiB"
else
    fail "fsck --memory 4M on the imported image (clean, in several passes):"
    tail -5 "$work/fsck-small.out" >&2
fi

"$zlogfs" mount "$img" "$mnt" -o uring=off
pid=$(pgrep -n -f "zlogfs mount $img") || pid=
start=$SECONDS
n=$(find "$mnt" -type f | wc -l)
if [ "$n" = "$files" ]; then ok "walk: find names $n files in $((SECONDS - start)) s"; else fail "walk: find names $n files of $files"; fi
start=$SECONDS
if rm -rf "${mnt:?}"/*; then ok "rm -rf of $files files in $((SECONDS - start)) s"; else fail "rm -rf"; fi
left=$(find "$mnt" -mindepth 1 | wc -l)
[ "$left" = 0 ] || fail "$left entries left after rm -rf"
if [ -n "$pid" ] && [ -r "/proc/$pid/status" ]; then
    mib=$(($(awk '/^VmHWM/ {print $2}' "/proc/$pid/status") / 1024))
    if [ "$mib" -le "$daemon_mib" ]; then ok "daemon: peak $mib MiB (bound $daemon_mib)"; else fail "daemon: peak $mib MiB, past its bound of $daemon_mib"; fi
else
    fail "no daemon process found for the mount"
fi
umount "$mnt"
echo "index runs after the delete: $(runs "$img")"
if "$zlogfs" fsck "$img" >"$work/fsck.out" 2>&1; then
    ok "fsck after the delete: $(tail -1 "$work/fsck.out")"
else
    fail "fsck after the delete:"
    tail -5 "$work/fsck.out" >&2
fi
[ $bad = 0 ] && echo "scale: all passed" || echo "scale: FAILED" >&2
exit $bad
