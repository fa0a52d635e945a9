# Sourced by the mount suites (tests/scale, tests/posix, tests/xfstests):
# sets $zlogfs to the binary under test. test.sh exports ZLOGFS_BIN, the
# binary its `cargo test` already built (the tests' build turns on
# test-only features, so a plain `cargo build` after it would compile the
# workspace again, about 160 s of CI). Run alone, a suite builds its own
# with $ZLOGFS_PROFILE: release, or test.sh's ci profile (release with
# debug assertions).
if [ -n "${ZLOGFS_BIN:-}" ]; then
    zlogfs=$ZLOGFS_BIN
    [ -x "$zlogfs" ] || { echo "ZLOGFS_BIN=$zlogfs is not an executable" >&2; exit 1; }
else
    cargo build --profile "${ZLOGFS_PROFILE:-release}" --quiet --bin zlogfs || exit 1
    zlogfs=$PWD/target/${ZLOGFS_PROFILE:-release}/zlogfs
fi
