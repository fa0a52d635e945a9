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
    profile=${ZLOGFS_PROFILE:-release}
    cargo build --profile "$profile" --quiet --bin zlogfs || exit 1
    case $profile in dev | test) profile=debug ;; esac
    zlogfs=$(cargo metadata --no-deps --format-version 1 |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')/$profile/zlogfs
fi
echo "binary under test: $zlogfs ($(stat -c %y "$zlogfs" | cut -d. -f1))"
