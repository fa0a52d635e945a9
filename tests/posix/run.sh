#!/usr/bin/env bash
# The POSIX suites written by others, against a real zlogfs mount:
#
#   pjdfstest  twice: default cache timeouts, and attr/entry/negative 0;
#              a second file system (/var/tmp) for the EXDEV cases
#   fsx        50,000 operations a seed, every operation enabled, in
#              directories whose codec policy is zstd:3 and zstd:19 on the
#              first transport, lz4 and none on the second (all four on
#              each with POSIX_LARGE=1, or on a lone transport); zstd:19
#              a fifth of the operations: each partial write recompresses
#              a 64 KiB chunk at level 19, about 10 ms, ten times the others
#   fio        verify=crc32c on incompressible, zero-filled and 50%
#              compressible data: write, unmount, fsck, mount, --verify_only
#   clean      fio randwrite with verify, 4 loops of 88 MiB on a 128 MiB
#              image (70% full), `zlogfs clean` on the mount, verify again
#   stress     4 writers checking their own files (create, 4 KiB and larger
#              overwrites, some O_DIRECT, appends, truncates, deletes), 4
#              readers and `zlogfs clean` in a loop, at once (stress.py),
#              with patches and with -o nopatches; fsck after (issue 24)
#   two        an image of two files (mkfs --fast, issue 29): pjdfstest
#              (both passes), fsx with 2 seeds, and the stress run on a
#              fast device small enough that small files spill to the bulk
#              one while the cleaner runs; fsck after each
#   s3         an image in a bucket of a real S3 server (moto on
#              127.0.0.1, issue 30): pjdfstest and fsx with sync=remote;
#              /usr/include copied in and fsynced, the daemon killed -9
#              and remounted, in both sync modes (with sync=remote, where
#              each fsync waits for an upload, 54 ms a file, its linux/
#              part only, unless POSIX_LARGE=1); export through an empty
#              cache directory; the Linux source tree in and out the same
#              way (with POSIX_LARGE=1, when test.sh unpacked it); fsck
#              after each
#
# pjdfstest and fsx run on each transport: FUSE over io_uring (-o uring,
# which turns the fuse module's enable_uring on) and /dev/fuse
# (-o nouring); fsx with other seeds on the second. fio writes through
# io_uring and verifies through /dev/fuse after the remount, and the
# cleaner's run is on io_uring. A kernel without FUSE over io_uring
# (before Linux 6.14) tests /dev/fuse only, with a note; CI insists.
#
# Needs root, /dev/fuse, fusermount3 and the tools (.ci/run installs them:
# fuse3, fio, attr, and `cargo install pjdfstest fsx`). Without them it says
# what is missing and exits 0, except under CI=true, where it fails.
#
#   tests/posix/run.sh                 # everything
#   POSIX_SUITES="fsx fio" tests/posix/run.sh
#   FSX_OPS=5000 tests/posix/run.sh    # shorter fsx runs
#   STRESS_SECS=180 POSIX_SUITES=stress tests/posix/run.sh   # the long stress run
#   bash bench/posix-large.sh          # the large version of everything
set -euo pipefail
cd "$(dirname "$0")/../.."
here=tests/posix
suites="${POSIX_SUITES:-pjdfstest fsx fio clean stress two s3}"
stress_secs="${STRESS_SECS:-40}"
fsx_ops="${FSX_OPS:-50000}"

missing=()
[ "$(id -u)" = 0 ] || missing+=("root")
[ -e /dev/fuse ] || missing+=("/dev/fuse")
for t in fusermount3 pjdfstest fsx fio setfattr; do
    command -v "$t" >/dev/null || missing+=("$t")
done
if [ ${#missing[@]} -gt 0 ]; then
    if [ "${CI:-}" = true ]; then
        echo "posix suites: missing ${missing[*]}" >&2
        exit 1
    fi
    echo "note: posix suites skipped, missing: ${missing[*]} (see .ci/run)"
    exit 0
fi

if [ -e /sys/module/fuse/parameters/enable_uring ]; then
    transports=(uring nouring)
elif [ "${CI:-}" = true ]; then
    echo "posix suites: this kernel has no FUSE over io_uring (Linux 6.14+), which CI must test" >&2
    exit 1
else
    echo "note: no FUSE over io_uring in this kernel: the suites test /dev/fuse only"
    transports=(nouring)
fi
first=${transports[0]}
last=${transports[${#transports[@]} - 1]}

. tests/lib/zlogfs-bin.sh
work=$(mktemp -d /var/tmp/zlogfs-posix.XXXXXX)
img="$work/img"
fast="$work/fast" # the fast device of the two-device suite
mnt="$work/mnt"
sec="$work/second" # on the host file system: cross-device for EXDEV
mkdir -p "$mnt" "$sec"
chmod 755 "$work" # pjdfstest switches to other users, who must reach the mount
# mount(8) reaches zlogfs through this helper for `mount -o remount,ro`
# (pjdfstest's EROFS cases).
helper=/sbin/mount.fuse.zlogfs
# A link (perhaps left dangling by another checkout's run) points at this
# build while the suite runs and back afterwards; an installed helper (a
# file) is used as it is.
made_helper=0
old_helper=$(readlink "$helper" || true)
if [ -n "$old_helper" ] || [ ! -e "$helper" ]; then
    ln -sfn "$zlogfs" "$helper"
    made_helper=1
fi
cleanup() {
    mountpoint -q "$mnt" && umount "$mnt" || true
    mountpoint -q "$work/reader" && umount "$work/reader" || true
    if [ "$made_helper" = 1 ]; then
        if [ -n "$old_helper" ]; then ln -sfn "$old_helper" "$helper"; else rm -f "$helper"; fi
    fi
    rm -rf "$work"
}
trap cleanup EXIT

passed=0
failed=0
ok() { passed=$((passed + 1)); echo "  ok: $*"; }
bad() { failed=$((failed + 1)); echo "  FAILED: $*"; }

fio_failure() { # LOG: fio's errors (before its statistics), then its last lines
    grep -m 10 -E 'error|verify|err=' "$1" || true
    tail -n 20 "$1"
}
fresh() { # SIZE [mount options]
    rm -f "$img" "$fast"
    "$zlogfs" mkfs "$img" --size "$1" 2>/dev/null
    "$zlogfs" mount ${2:+-o "$2"} "$img" "$mnt"
}
fresh_two() { # SIZE FAST-SIZE mount-options: bulk $img, fast $fast
    rm -f "$img" "$fast"
    "$zlogfs" mkfs "$img" --fast "$fast" --size "$1" --fast-size "$2" 2>/dev/null
    "$zlogfs" mount -o "$3,fast=$fast" "$img" "$mnt"
}
unmount_and_check() { # what
    umount "$mnt"
    # The daemon closes the image right after the unmount.
    for _ in $(seq 100); do
        "$zlogfs" fsck "$img" >"$work/fsck" 2>&1 && break
        grep -q 'in use' "$work/fsck" || break
        sleep 0.1
    done
    # Clean, and segment usage exactly what the live blocks hold: nothing
    # here crashes, so nothing may leak.
    if "$zlogfs" fsck --json "$img" >"$work/fsck" 2>&1 &&
        python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); sys.exit(0 if r["clean"] and r["leaked_bytes"] == 0 else 1)' "$work/fsck"; then
        ok "fsck clean after $1"
    else
        bad "fsck after $1"
        cat "$work/fsck"
    fi
}

stress_with_cleaner() { # what: stress.py on $mnt with `zlogfs clean` in a loop beside it
    local seed=$((RANDOM * 32768 + RANDOM)) stop="$work/stress.stop" loop
    rm -f "$stop"
    (while [ ! -e "$stop" ]; do "$zlogfs" clean "$mnt" >/dev/null 2>>"$work/cleanloop.err" || true; done) &
    loop=$!
    if python3 "$here/stress.py" "$mnt" "$stress_secs" "$seed" 4 4 >"$work/stress.log" 2>&1; then
        ok "stress.py, seed $seed, $1"
    else
        bad "stress.py, seed $seed, $1 (replay: python3 $here/stress.py MNT $stress_secs $seed)"
        tail -n 20 "$work/stress.log"
    fi
    touch "$stop"
    wait "$loop"
    if [ -s "$work/cleanloop.err" ]; then
        bad "zlogfs clean in the loop said:"
        sort "$work/cleanloop.err" | uniq -c | head -10
        rm -f "$work/cleanloop.err"
    fi
}

if [[ " $suites " == *" pjdfstest "* ]]; then
    # The EROFS cases remount the file system read-only, which fails with
    # EBUSY on any file system (tmpfs too) while earlier cases of the same
    # run still hold files open for writing: they run on their own, with
    # remounts allowed, after the rest.
    sed 's/^allow_remount = .*/allow_remount = true/' "$here/pjdfstest.toml" >"$work/pjdfstest-remount.toml"
    for cache in "allow_other" "allow_other,attr_timeout=0,entry_timeout=0,negative_timeout=0"; do
    for t in "${transports[@]}"; do
        cache_t="$cache,$t"
        echo "== pjdfstest, -o $cache_t [at ${SECONDS} s]"
        fresh 2G "$cache_t"
        chmod 777 "$mnt"
        for pass in all erofs; do
            if [ $pass = all ]; then conf="$PWD/$here/pjdfstest.toml"; pat=(); else conf="$work/pjdfstest-remount.toml"; pat=(erofs); fi
            if (cd "$mnt" && pjdfstest -c "$conf" -p "$mnt" -s "$sec" "${pat[@]}") >"$work/pjd.log" 2>&1; then
                ok "pjdfstest ($pass, $cache_t): $(grep -o 'Summary:.*' "$work/pjd.log")"
            else
                bad "pjdfstest ($pass, $cache_t): $(grep -o 'Summary:.*' "$work/pjd.log" || echo 'did not finish')"
                grep -v -E '^\s+([0-9]+:|at )' "$work/pjd.log" | grep -A4 -E 'FAILED' | head -60
            fi
            # Skips other than the EROFS cases (which the erofs pass runs).
            grep -E 'skipped$' -A1 "$work/pjd.log" | grep -v -- '^--' | paste - - | grep -v allow_remount \
                | sed 's/^/    skipped: /' || true
        done
        unmount_and_check "pjdfstest ($cache_t)"
    done
    done
fi

if [[ " $suites " == *" fsx "* ]]; then
    seed=1
    for t in "${transports[@]}"; do
        # Two codecs on each transport, all four between them (the large
        # run, POSIX_LARGE=1, or a lone transport takes all four).
        codecs=(zstd:3 zstd:19)
        [ "$t" = "$first" ] || codecs=(lz4 none)
        if [ "${POSIX_LARGE:-0}" = 1 ] || [ ${#transports[@]} = 1 ]; then codecs=(zstd:3 lz4 none zstd:19); fi
        echo "== fsx: ${#codecs[@]} seeds x $fsx_ops operations (zstd:19 a fifth), -o $t [at ${SECONDS} s]"
        # A large image (a sparse file): fsx rewrites its file for a long
        # time, and this is not a test of the cleaner.
        fresh 24G "$t"
        for codec in "${codecs[@]}"; do
            d="$mnt/${codec/:/-}"
            mkdir "$d"
            setfattr -n user.zlogfs.codec -v "$codec" "$d"
            ops=$fsx_ops
            [ "$codec" = zstd:19 ] && ops=$((fsx_ops / 5 > 0 ? fsx_ops / 5 : 1))
            if fsx -q -f "$PWD/$here/fsx.toml" -N "$ops" -S "$seed" -P "$work" "$d/fsx" >"$work/fsx.log" 2>&1 \
                && grep -q 'A-OK' "$work/fsx.log"; then
                ok "fsx seed $seed, codec $codec, $ops operations, $t: $(tail -n 1 "$work/fsx.log")"
            else
                bad "fsx seed $seed, codec $codec, $ops operations, $t"
                tail -n 40 "$work/fsx.log"
            fi
            seed=$((seed + 1))
        done
        unmount_and_check "fsx ($t)"
    done
fi

if [[ " $suites " == *" fio "* ]]; then
    echo "== fio verify=crc32c across a remount: written with -o $first, verified with -o $last [at ${SECONDS} s]"
    fresh 4G "$first"
    # With verify on, fio fills buffers itself: zeros need verify_pattern.
    kinds=(random "" zero "--verify_pattern=0x00" half "--buffer_compress_percentage=50 --refill_buffers")
    job() { # name extra-args... : 96 MiB of random-order writes of 4 KiB to 1 MiB
        local name=$1
        shift
        fio --name="$name" --directory="$mnt" --filename="$name" --size=96M --rw=randwrite \
            --bsrange=4k-1m --ioengine=psync --verify=crc32c --verify_fatal=1 --end_fsync=1 \
            --randseed=7 --verify_state_save=0 "$@"
    }
    for ((i = 0; i < ${#kinds[@]}; i += 2)); do
        # shellcheck disable=SC2086
        if job "${kinds[i]}" ${kinds[i + 1]} >"$work/fio.log" 2>&1; then ok "fio write+verify (${kinds[i]} data)"; else
            bad "fio write+verify (${kinds[i]} data)"
            fio_failure "$work/fio.log"
        fi
    done
    unmount_and_check "fio writes"
    "$zlogfs" mount -o "$last" "$img" "$mnt"
    for ((i = 0; i < ${#kinds[@]}; i += 2)); do
        # shellcheck disable=SC2086
        if job "${kinds[i]}" ${kinds[i + 1]} --verify_only >"$work/fio.log" 2>&1; then
            ok "fio --verify_only after remount (${kinds[i]} data)"
        else
            bad "fio --verify_only after remount (${kinds[i]} data)"
            fio_failure "$work/fio.log"
        fi
    done
    unmount_and_check "fio verify"
    "$zlogfs" stats "$img" 2>/dev/null | grep -E 'file data|writes' | sed 's/^/    /' || true
fi

if [[ " $suites " == *" clean "* ]]; then
    echo "== fio overwrites, 2.75x the capacity, of an image kept 70% full (the cleaner keeps up), -o $first [at ${SECONDS} s]"
    fresh 128M "$first"
    # 88 MiB of incompressible data in 128 MiB, rewritten in random order
    # in 64 KiB and 4 KiB blocks, each loop verified (crc32c) after it.
    ow() {
        fio --name=ow --directory="$mnt" --filename=ow --size=88M --rw=randwrite --bsrange=4k-64k \
            --ioengine=psync --verify=crc32c --verify_fatal=1 --end_fsync=1 --randseed=11 \
            --verify_state_save=0 "$@"
    }
    if ow --loops=4 >"$work/fio.log" 2>&1; then ok "fio randwrite+verify, 4 loops of 88 MiB on 128 MiB"; else
        bad "fio randwrite+verify at 70% full"
        fio_failure "$work/fio.log"
    fi
    if "$zlogfs" clean "$mnt" --json >"$work/clean.json" 2>&1 && grep -q '"freed"' "$work/clean.json"; then
        ok "zlogfs clean on the mount: $(tr -d ' \n' <"$work/clean.json" | cut -c1-120)"
    else
        bad "zlogfs clean on the mount"
        cat "$work/clean.json"
    fi
    unmount_and_check "the overwrites"
    "$zlogfs" mount -o "$first" "$img" "$mnt"
    if ow --verify_only >"$work/fio.log" 2>&1; then ok "fio --verify_only after remount"; else
        bad "fio --verify_only after the overwrites and a remount"
        fio_failure "$work/fio.log"
    fi
    unmount_and_check "verify after the overwrites"
    "$zlogfs" stats "$img" 2>/dev/null | grep -E 'space|writes' | sed 's/^/    /' || true
fi

if [[ " $suites " == *" stress "* ]]; then
    for opt in "$first" "$first,nopatches"; do
        echo "== writers, readers and zlogfs clean in a loop, ${stress_secs} s, -o $opt [at ${SECONDS} s]"
        fresh 256M "$opt"
        stress_with_cleaner "-o $opt"
        unmount_and_check "the stress run (-o $opt)"
    done
fi

if [[ " $suites " == *" two "* ]]; then
    echo "== two devices: pjdfstest, -o allow_other,$first [at ${SECONDS} s]"
    fresh_two 2G 256M "allow_other,$first"
    chmod 777 "$mnt"
    for pass in all erofs; do
        if [ $pass = all ]; then conf="$PWD/$here/pjdfstest.toml"; pat=(); else conf="$work/pjdfstest-remount.toml"; pat=(erofs); fi
        sed 's/^allow_remount = .*/allow_remount = true/' "$here/pjdfstest.toml" >"$work/pjdfstest-remount.toml"
        if (cd "$mnt" && pjdfstest -c "$conf" -p "$mnt" -s "$sec" "${pat[@]}") >"$work/pjd.log" 2>&1; then
            ok "pjdfstest on two devices ($pass): $(grep -o 'Summary:.*' "$work/pjd.log")"
        else
            bad "pjdfstest on two devices ($pass): $(grep -o 'Summary:.*' "$work/pjd.log" || echo 'did not finish')"
            grep -v -E '^\s+([0-9]+:|at )' "$work/pjd.log" | grep -A4 -E 'FAILED' | head -60
        fi
    done
    unmount_and_check "pjdfstest on two devices"
    echo "== two devices: fsx, 2 seeds x $fsx_ops operations, -o $first [at ${SECONDS} s]"
    fresh_two 24G 1G "$first"
    for seed in 11 12; do
        if fsx -q -f "$PWD/$here/fsx.toml" -N "$fsx_ops" -S "$seed" -P "$work" "$mnt/fsx$seed" >"$work/fsx.log" 2>&1 \
            && grep -q 'A-OK' "$work/fsx.log"; then
            ok "fsx seed $seed on two devices: $(tail -n 1 "$work/fsx.log")"
        else
            bad "fsx seed $seed on two devices"
            tail -n 40 "$work/fsx.log"
        fi
    done
    unmount_and_check "fsx on two devices"
    echo "== two devices: writers, readers and zlogfs clean, ${stress_secs} s, a 12 MiB fast device, -o $first [at ${SECONDS} s]"
    fresh_two 256M 12M "$first"
    stress_with_cleaner "on two devices"
    "$zlogfs" stats "$mnt" 2>/dev/null | grep -E 'device:' | sed 's/^/    /' || true
    unmount_and_check "the stress run on two devices"
fi

if [[ " $suites " == *" s3 "* ]]; then
    # A real S3 server (moto, from the venv test.sh makes) on 127.0.0.1.
    moto_bin="${ZLOGFS_MOTO_SERVER:-$PWD/target/moto/bin/moto_server}"
    if [ ! -x "$moto_bin" ]; then
        echo "no S3 server at $moto_bin: run ./test.sh once (it installs moto into target/moto)," >&2
        echo "or point ZLOGFS_MOTO_SERVER at a moto_server; or leave s3 out of POSIX_SUITES" >&2
        exit 2
    fi
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    "$moto_bin" -H 127.0.0.1 -p "$port" >"$work/moto.log" 2>&1 &
    moto_pid=$!
    for _ in $(seq 300); do
        python3 -c "import socket; socket.create_connection(('127.0.0.1', $port))" 2>/dev/null && break
        sleep 0.1
    done
    if ! kill -0 "$moto_pid" 2>/dev/null; then
        echo "the S3 server ($moto_bin) did not start; its output:" >&2
        cat "$work/moto.log" >&2
        exit 2
    fi
    export AWS_ENDPOINT_URL="http://127.0.0.1:$port" AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_REGION=us-east-1
    python3 -c "import urllib.request as u; u.urlopen(u.Request('$AWS_ENDPOINT_URL/posix', method='PUT'))"
    url=s3://posix/img
    cache="$work/s3cache"
    s3_unmount_and_check() { # what
        umount "$mnt"
        for _ in $(seq 100); do
            "$zlogfs" fsck --cache "$cache" "$url" >"$work/fsck" 2>&1 && break
            grep -q 'in use' "$work/fsck" || break
            sleep 0.1
        done
        if grep -q ': clean' "$work/fsck"; then ok "fsck clean after $1"; else
            bad "fsck after $1"
            cat "$work/fsck"
        fi
    }
    echo "== object store: pjdfstest, -o allow_other,$first,sync=remote [at ${SECONDS} s]"
    "$zlogfs" mkfs "$url" --cache "$cache" 2>/dev/null
    "$zlogfs" mount -o "allow_other,$first,sync=remote,cache=$cache" "$url" "$mnt"
    chmod 777 "$mnt"
    conf="$PWD/$here/pjdfstest.toml"
    if (cd "$mnt" && pjdfstest -c "$conf" -p "$mnt" -s "$sec") >"$work/pjd.log" 2>&1; then
        ok "pjdfstest on a bucket: $(grep -o 'Summary:.*' "$work/pjd.log")"
    else
        bad "pjdfstest on a bucket: $(grep -o 'Summary:.*' "$work/pjd.log" || echo 'did not finish')"
        { grep -v -E '^\s+([0-9]+:|at )' "$work/pjd.log" | grep -A4 -E 'FAILED' || tail -n 20 "$work/pjd.log"; } | head -60
    fi
    # A fifth of the usual operations: the other suites run fsx at length;
    # this one checks the store under it, and CI time is short.
    echo "== object store: fsx, 1 seed x $((fsx_ops / 5)) operations [at ${SECONDS} s]"
    if fsx -q -f "$PWD/$here/fsx.toml" -N "$((fsx_ops / 5))" -S 21 -P "$work" "$mnt/fsx" >"$work/fsx.log" 2>&1 \
        && grep -q 'A-OK' "$work/fsx.log"; then
        ok "fsx seed 21 on a bucket: $(tail -n 1 "$work/fsx.log")"
    else
        bad "fsx seed 21 on a bucket"
        tail -n 40 "$work/fsx.log"
    fi
    s3_unmount_and_check "pjdfstest and fsx on a bucket"
    for mode in local remote; do
        # sync=remote uploads at each fsync: the whole tree (7,975 files)
        # took 428 s of CI's hour, its linux/ part (763) takes a tenth.
        src=/usr/include
        if [ $mode = remote ] && [ "${POSIX_LARGE:-0}" != 1 ]; then src=/usr/include/linux; fi
        echo "== object store: $src in, fsync, kill -9, remount (sync=$mode) [at ${SECONDS} s]"
        "$zlogfs" mount -o "sync=$mode,cache=$cache" "$url" "$mnt"
        rm -rf "$mnt/include"
        cp -a "$src" "$mnt/include"
        python3 -c 'import os, sys
for d, _, fs in os.walk(sys.argv[1]):
    for f in fs:
        p = os.path.join(d, f)
        if not os.path.islink(p):
            fd = os.open(p, os.O_RDONLY); os.fsync(fd); os.close(fd)
fd = os.open(sys.argv[1], os.O_RDONLY); os.fsync(fd); os.close(fd)' "$mnt/include"
        pkill -9 -f "zlogfs mount $url" || true
        sleep 0.5
        umount -l "$mnt" 2>/dev/null || true
        "$zlogfs" mount -o "sync=$mode,cache=$cache" "$url" "$mnt"
        if diff -r --no-dereference "$src" "$mnt/include" >"$work/diff.log" 2>&1; then
            ok "every fsynced file back after kill -9 (sync=$mode, cache kept)"
        else
            bad "files lost or changed after kill -9 (sync=$mode)"
            head -20 "$work/diff.log"
        fi
        "$zlogfs" stats "$mnt" 2>/dev/null | grep 'object store' | sed 's/^/    /' || true
        s3_unmount_and_check "kill -9 and remount (sync=$mode)"
    done
    echo "== object store: a read-only mount follows the writer (-o ro,refresh=1) [at ${SECONDS} s]"
    fsync_tree() { # dir: every file in it, and it, fsynced (sync(1) does not reach a FUSE daemon)
        python3 -c 'import os, sys
for d, _, fs in os.walk(sys.argv[1]):
    for n in fs + ["."]:
        p = os.path.join(d, n)
        if not os.path.islink(p):
            fd = os.open(p, os.O_RDONLY); os.fsync(fd); os.close(fd)' "$1"
    }
    # Waits up to 30 s for the reader to show what `check` looks for.
    reader_sees() { # check-command...
        for _ in $(seq 60); do "$@" >/dev/null 2>&1 && return 0; sleep 0.5; done
        return 1
    }
    reader="$work/reader"
    mkdir -p "$reader"
    "$zlogfs" mount -o "sync=remote,cache=$cache" "$url" "$mnt"
    "$zlogfs" mount -o "ro,refresh=1,cache=$work/reader-cache" "$url" "$reader"
    rm -rf "$mnt/follow"
    mkdir "$mnt/follow"
    cp -a /usr/include/linux "$mnt/follow/stable"
    fsync_tree "$mnt/follow"
    if reader_sees diff -r --no-dereference /usr/include/linux "$reader/follow/stable"; then
        ok "a read-only mount shows a tree the writer synced after it mounted"
    else
        bad "the read-only mount did not follow the writer"
        diff -r --no-dereference /usr/include/linux "$reader/follow/stable" | head -5
    fi
    # The writer replaces trees and cleans while the reader reads a tree
    # nobody changes: every pass of it is whole and right, across the
    # reader's refreshes. The reader's manifest is read before the writer
    # starts (`zlogfs stats` walks the whole tree, seconds on a reader whose
    # cache is cold: CI once saw the writer finish before it answered), and
    # the reader reads at least once.
    reader_manifest() { "$zlogfs" stats "$reader" 2>/dev/null | grep -o 'manifest [0-9]*' | grep -o '[0-9]*'; }
    before=$(reader_manifest)
    (
        for i in 1 2 3 4 5; do
            cp -a /usr/include/sound "$mnt/follow/churn$i"
            rm -rf "$mnt/follow/churn$((i - 1))"
            fsync_tree "$mnt/follow"
            "$zlogfs" clean "$mnt" >/dev/null 2>&1
            sleep 1
        done
    ) &
    churn=$!
    passes=0
    wrong=0
    while [ "$passes" = 0 ] || kill -0 "$churn" 2>/dev/null; do
        diff -r --no-dereference /usr/include/linux "$reader/follow/stable" >"$work/diff.log" 2>&1 || wrong=$((wrong + 1))
        passes=$((passes + 1))
    done
    wait "$churn"
    # The reader moves on within its refresh interval (1 s) once the writer's
    # last upload lands: up to 30 s here.
    reader_moved() { after=$(reader_manifest) && [ "${after:-0}" -gt "${before:-0}" ]; }
    reader_sees reader_moved || true
    if [ "$wrong" = 0 ] && [ "$passes" -gt 0 ] && [ "${after:-0}" -gt "${before:-0}" ]; then
        ok "$passes reads of an unchanged tree during the writer's changes and cleaning, the reader from manifest $before to $after: all right"
    else
        bad "$wrong of $passes reads of an unchanged tree went wrong while following (manifest $before to $after)"
        head -5 "$work/diff.log"
    fi
    if reader_sees diff -r --no-dereference /usr/include/sound "$reader/follow/churn5" &&
        reader_sees test ! -e "$reader/follow/churn4"; then
        ok "the reader ends at the writer's last state"
    else
        bad "the reader did not reach the writer's last state"
    fi
    if touch "$reader/follow/x" 2>"$work/touch.log" || ! grep -q 'Read-only' "$work/touch.log"; then
        bad "a write through the read-only mount: $(cat "$work/touch.log")"
    else
        ok "the read-only mount refuses writes (EROFS)"
    fi
    umount "$reader"
    rm -rf "$work/reader-cache"
    s3_unmount_and_check "following"
    echo "== object store: export from an empty cache (another machine's view) [at ${SECONDS} s]"
    rm -rf "$work/export"
    # include/ holds what the last kill -9 pass (sync=remote) copied: $src.
    if "$zlogfs" export --cache "$work/empty-cache" "$url" "$work/export" >/dev/null 2>"$work/export.log" &&
        diff -r --no-dereference "$src" "$work/export/include" >"$work/diff.log" 2>&1; then
        ok "export through an empty cache: identical to $src"
    else
        bad "export through an empty cache"
        head -20 "$work/export.log" "$work/diff.log"
    fi
    rm -rf "$work/export" "$work/empty-cache"
    # The Linux source tree when test.sh unpacked it (ZLOGFS_ROUNDTRIP_TREES).
    # Only in the large run (POSIX_LARGE=1, bench/posix-large.sh): 1.5 GB
    # through moto took minutes of CI's hour.
    linux=""
    if [ "${POSIX_LARGE:-0}" = 1 ]; then
        for t in ${ZLOGFS_ROUNDTRIP_TREES:-}; do [[ "$t" == *linux* ]] && linux=$t; done
    fi
    if [ -n "$linux" ]; then
        echo "== object store: the Linux source tree in (sync=local), unmount, export through an empty cache [at ${SECONDS} s]"
        "$zlogfs" mount -o "cache=$cache" "$url" "$mnt"
        rm -rf "$mnt/include"
        cp -a "$linux" "$mnt/linux"
        "$zlogfs" stats "$mnt" 2>/dev/null | grep 'object store' | sed 's/^/    /' || true
        s3_unmount_and_check "the Linux tree in"
        if "$zlogfs" export --cache "$work/empty-cache" --path /linux "$url" "$work/export" >/dev/null 2>"$work/export.log" &&
            diff -r --no-dereference "$linux" "$work/export" >"$work/diff.log" 2>&1; then
            ok "the Linux tree through a bucket: exported through an empty cache, identical"
        else
            bad "the Linux tree through a bucket"
            head -20 "$work/export.log" "$work/diff.log"
        fi
        rm -rf "$work/export" "$work/empty-cache"
    fi
    kill "$moto_pid"
    wait "$moto_pid" 2>/dev/null || true
fi

echo "posix suites: $passed passed, $failed failed"
[ "$failed" = 0 ]
