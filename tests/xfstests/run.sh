#!/usr/bin/env bash
# xfstests (../shared/xfstests: a snapshot of the suite Linux file systems
# are developed against, and its runner) on zlogfs mounts through
# /dev/fuse: the quick group less tests/xfstests/exclude and, unless
# XFSTESTS_SLOW=1, tests/xfstests/slow (each line says why). Fails on any
# failure, on a commit failure in the daemons' log, and on an image fsck
# does not find clean afterwards. As root; skipped with a
# note elsewhere, and where ../shared/xfstests is missing (not under CI).
#   bash tests/xfstests/run.sh                  # the quick group
#   GROUP="generic/013" bash tests/xfstests/run.sh
#   EXCLUDE=/dev/null GROUP="generic/103" ...  # run an excluded test
#   XFSTESTS_SLOW=1 bash tests/xfstests/run.sh  # with tests/xfstests/slow
# Prints "xfstests: N passed, M failed" for test.sh's count.
set -uo pipefail
cd "$(dirname "$0")/../.."
shared=$(realpath -m "${XFSTESTS:-../shared/xfstests}")
if [ "$(id -u)" != 0 ] || [ ! -e /dev/fuse ]; then
    [ "${CI:-}" = true ] && { echo "xfstests need root and /dev/fuse under CI" >&2; exit 1; }
    echo "note: xfstests need root and /dev/fuse: skipped"
    exit 0
fi
if [ ! -f "$shared/run.sh" ]; then
    [ "${CI:-}" = true ] && { echo "no $shared/run.sh under CI" >&2; exit 1; }
    echo "note: no $shared/run.sh: xfstests skipped"
    exit 0
fi
W=${W:-/var/tmp/xfstests-zlogfs}
mkdir -p "$W"
log=$W/zlogfs-daemons.log
rm -f "$log"
. tests/lib/zlogfs-bin.sh
# The exclusions: tests/xfstests/exclude, and tests/xfstests/slow unless
# XFSTESTS_SLOW=1 (both files give each test's reason).
exclude=${EXCLUDE:-$PWD/tests/xfstests/exclude}
if [ "${XFSTESTS_SLOW:-0}" != 1 ] && [ -z "${EXCLUDE:-}" ]; then
    exclude=$W/exclude
    cat tests/xfstests/exclude tests/xfstests/slow >"$exclude"
fi
start=$(date +%s)
ZLOGFS=$zlogfs W=$W GROUP="${GROUP:--g quick}" LIMIT="${LIMIT:-40m}" \
    MOUNT_OPTS="-o allow_other,uring=off,logfile=$log" EXCLUDE="$exclude" \
    bash "$shared/run.sh" deps unpack build users config run summary fsck 2>&1 | tee "$W/ci.out"
echo "xfstests took $(($(date +%s) - start)) s"
bad=0
ran=$(grep -E '^Ran:' "$W/run.log" | head -1 | wc -w)
ran=$((ran > 0 ? ran - 1 : 0))
failed=$(grep -E '^Failures:' "$W/run.log" | head -1 | wc -w)
failed=$((failed > 0 ? failed - 1 : 0))
notrun=$(grep -E '^Not run:' "$W/run.log" | head -1 | wc -w)
notrun=$((notrun > 0 ? notrun - 2 : 0))
if [ "$ran" = 0 ]; then
    echo "xfstests ran no test (see $W/run.log)" >&2
    bad=1
fi
if [ "$failed" -gt 0 ]; then
    echo "xfstests failures: $(grep -E '^Failures:' "$W/run.log" | head -1)" >&2
    for f in "$W"/results/generic/*.out.bad; do
        [ -f "$f" ] && { echo "== $f"; head -30 "$f"; }
    done
    bad=1
fi
# fsck of both images must be clean: any problem, or a failed fsck, fails
# the run.
fsck_out=$(sed -n '/^##### fsck/,$p' "$W/ci.out")
if ! grep -q '^== zlogfs fsck' <<<"$fsck_out"; then
    echo "fsck did not run after xfstests" >&2
    bad=1
fi
if grep -qE '^problem:|^zlogfs: ' <<<"$fsck_out"; then
    echo "an image is not clean after xfstests (fsck above)" >&2
    bad=1
fi
if [ -f "$log" ] && grep -iE 'commit.*(failed|exceeds)|exceeds the (journal )?limit|exceeds the limits' "$log" | head -5 | grep -q .; then
    echo "the daemons logged commit failures ($log):" >&2
    grep -iE 'commit.*(failed|exceeds)|exceeds the (journal )?limit|exceeds the limits' "$log" | head -5 >&2
    bad=1
fi
echo "xfstests: $((ran - failed - notrun)) passed, $failed failed, $notrun skipped"
exit $bad
