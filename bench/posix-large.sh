#!/usr/bin/env bash
# The large version of tests/posix/run.sh (CI runs the short one): fsx
# at 200,000 operations a seed (40,000 at zstd:19), the stress runs for 3
# minutes each, and the Linux source tree through an object-store mount
# and out through an empty cache; then xfstests' quick group with the
# tests CI skips for time (tests/xfstests/slow). Root, /dev/fuse and the
# tools .ci/run installs; an hour and a half or more on two cores.
#
#   bash bench/posix-large.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
export ZLOGFS_ROUNDTRIP_TREES=${ZLOGFS_ROUNDTRIP_TREES:-$(linux_tree /var/tmp/zlogfs-bench)}
[ -x target/moto/bin/moto_server ] || { python3 -m venv target/moto && target/moto/bin/pip install --quiet 'moto[server]'; }
rc=0
POSIX_LARGE=1 FSX_OPS=${FSX_OPS:-200000} STRESS_SECS=${STRESS_SECS:-180} bash tests/posix/run.sh || rc=1
# xfstests' quick group with the tests CI skips for time (tests/xfstests/slow),
# also when a suite above failed.
XFSTESTS_SLOW=1 bash tests/xfstests/run.sh || rc=1
exit $rc
