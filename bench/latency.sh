#!/usr/bin/env bash
# The flash paper's Cuadro 1 (seed 004: JFFS2 on the OLPC laptop) on
# zlogfs (issue 26): the mean latency of a 4 KiB write() followed by
# fsync(), and of a cold 4 KiB read(), through the mount, with each codec,
# beside ext4 and btrfs (compress=zlib and none) on the same device; with
# zlogfs's own split of the time into compression, decompression and the
# device (`zlogfs stats --latency`).
#
#   bash bench/latency.sh
#
# Two devices, each a loop device so that every file system sits on the
# same kind of block device:
# - slow: a flash-like device, WRITE_BPS (default 2 MB/s) and READ_BPS
#   (default 8 MB/s) with LATENCY_US (default 200 µs) per request, made
#   by bench/slowdev.py (a one-file FUSE server that sleeps as such a
#   device would). The kernel's cgroup v1 blkio throttle was the first
#   choice, but it throttles only direct I/O submitted by the process in
#   the cgroup: the writeback by which ext4, btrfs and zlogfs write on
#   fsync is charged to the root cgroup, and measured no slower (408 µs
#   throttled, 410 µs not, ext4 4 KiB write+fsync).
# - fast: the machine's disk (a sparse file in /var/tmp).
#
# Data: the first N (default 256) 4 KiB blocks of the linux-source tree's
# files, concatenated (real text, not one repeated pattern: the paper
# found iozone's pattern compressed far beyond real data). Each write is
# one block at the end of one file, then fsync; reads are the same file
# read back in 4 KiB read()s after a remount and dropped caches (the
# kernel's read-ahead included, as in the paper's averages).
#
# Prints a Markdown table and writes it to bench/results/latency-DATE.md
# (or OUT). Needs root, fuse3, libfuse2, btrfs-progs and python3-venv
# (installed when missing); fusepy goes into a venv under /var/tmp.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
need_tools mkfs.btrfs:btrfs-progs fusermount3:fuse3
[ -e /usr/lib/x86_64-linux-gnu/libfuse.so.2 ] || apt-get install -y -q libfuse2 >/dev/null
n=${N:-256}
wbps=${WRITE_BPS:-2000000}
rbps=${READ_BPS:-8000000}
lat=${LATENCY_US:-200}
codecs=${CODECS:-none lz4 zstd:1 zstd:3 deflate}
cache=/var/tmp/zlogfs-bench
venv=$cache/venv
if ! "$venv/bin/python" -c 'import fuse' 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q fusepy
fi
cargo build --release -q
z=$PWD/target/release/zlogfs
tree=$(linux_tree "$cache")
work=$(mktemp -d /var/tmp/zlogfs-latency.XXXXXX)
mkdir -p "$work/slow" "$work/mnt"
loop=""
cleanup() {
    mountpoint -q "$work/mnt" && umount "$work/mnt"
    [ -n "$loop" ] && losetup -d "$loop" 2>/dev/null
    mountpoint -q "$work/slow" && umount "$work/slow"
    rm -rf "$work"
}
trap cleanup EXIT
# The data: N blocks of the tree's files.
# (head ends the pipe early: cat's SIGPIPE is expected.)
set +o pipefail
find "$tree" -type f -name '*.[ch]' -print0 | sort -z | xargs -0 cat 2>/dev/null | head -c $((n * 4096)) >"$work/data"
set -o pipefail

drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }

# measure write|read FILE: mean, p50 and p99 of the calls, in µs, as JSON.
measure() {
    python3 - "$1" "$2" "$work/data" "$n" <<'EOF'
import json, os, sys, time
mode, path, data, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
ts = []
if mode == "write":
    blocks = open(data, "rb").read()
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    for i in range(n):
        t = time.perf_counter_ns()
        os.write(fd, blocks[i * 4096:(i + 1) * 4096])
        os.fsync(fd)
        ts.append(time.perf_counter_ns() - t)
else:
    fd = os.open(path, os.O_RDONLY)
    for i in range(n):
        t = time.perf_counter_ns()
        b = os.read(fd, 4096)
        ts.append(time.perf_counter_ns() - t)
        assert len(b) == 4096
os.close(fd)
ts.sort()
print(json.dumps({"mean": sum(ts) / len(ts) / 1e3, "p50": ts[len(ts) // 2] / 1e3, "p99": ts[len(ts) * 99 // 100] / 1e3}))
EOF
}

# make_sys SYS: a fresh file system on $loop.
make_sys() {
    case $1 in
    z:*) "$z" mkfs "$loop" --codec "${1#z:}" --force >/dev/null ;;
    ext4) mkfs.ext4 -q -F "$loop" ;;
    btrfs:*) mkfs.btrfs -q -f "$loop" >/dev/null ;;
    esac
}
mount_sys() {
    case $1 in
    z:*) "$z" mount "$loop" "$work/mnt" ;;
    ext4) mount "$loop" "$work/mnt" ;;
    btrfs:none) mount -o compress=no "$loop" "$work/mnt" ;;
    btrfs:zlib) mount -o compress-force=zlib "$loop" "$work/mnt" ;;
    esac
}
umount_sys() {
    case $1 in
    z:*) fusermount3 -u "$work/mnt"; while pgrep -f "zlogfs mount $loop" >/dev/null; do sleep 0.1; done ;;
    *) umount "$work/mnt" ;;
    esac
}
# split SYS FIELD: zlogfs's time in a part of the split, per call (µs).
split() {
    "$z" stats "$work/mnt" --latency --json |
        python3 -c "import json,sys; v=json.load(sys.stdin); print('%.1f' % (v['split'].get('$2', {}).get('total_ns', 0) / 1e3 / $n))"
}

systems=()
for c in $codecs; do systems+=("z:$c"); done
systems+=(ext4 btrfs:none btrfs:zlib)
declare -A R
for dev in slow fast; do
    if [ $dev = slow ]; then
        truncate -s 1G "$work/slow.img"
        "$venv/bin/python" bench/slowdev.py "$work/slow.img" "$work/slow" \
            --write-bps "$wbps" --read-bps "$rbps" --latency-us "$lat" 2>"$work/slowdev.log" &
        for _ in $(seq 50); do [ -e "$work/slow/dev" ] && break; sleep 0.1; done
        loop=$(losetup -f --show "$work/slow/dev")
    else
        truncate -s 1G "$work/fast.img"
        loop=$(losetup -f --show "$work/fast.img")
    fi
    for sys in "${systems[@]}"; do
        echo "== $dev: $sys" >&2
        make_sys "$sys"
        mount_sys "$sys"
        R[$dev,$sys,write]=$(measure write "$work/mnt/f")
        if [[ $sys == z:* ]]; then
            R[$dev,$sys,compress]=$(split "$sys" compress)
            R[$dev,$sys,devwrite]=$(split "$sys" device_write)
            R[$dev,$sys,devsync]=$(split "$sys" device_sync)
        fi
        umount_sys "$sys"
        drop
        mount_sys "$sys"
        R[$dev,$sys,read]=$(measure read "$work/mnt/f")
        [[ $sys == z:* ]] && R[$dev,$sys,decompress]=$(split "$sys" decompress)
        umount_sys "$sys"
    done
    losetup -d "$loop"
    loop=""
    [ $dev = slow ] && umount "$work/slow"
done

field() { python3 -c "import json,sys; print('%.0f' % json.loads(sys.argv[1])['$2'])" "$1"; }
out=${OUT:-bench/results/latency-$(date -u +%F).md}
{
    echo "Machine: $(nproc) cores, kernel $(uname -r); $(date -u +%Y-%m-%dT%H:%MZ); commit $(git rev-parse --short HEAD)"
    echo "Command: ${N:+N=$N }${WRITE_BPS:+WRITE_BPS=$WRITE_BPS }${READ_BPS:+READ_BPS=$READ_BPS }${LATENCY_US:+LATENCY_US=$LATENCY_US }bash bench/latency.sh; $n blocks of 4 KiB of linux-source C files"
    echo "Slow device: ${wbps} B/s writes, ${rbps} B/s reads, ${lat} µs per request (bench/slowdev.py under a loop device); fast: a loop device on a file in /var/tmp."
    echo "Times in µs per call: mean (p50, p99). zlogfs's compress, device write and sync are its own counters per write() call; decompress per read() call."
    for dev in slow fast; do
        echo
        echo "#### $dev device"
        echo
        echo "| system | write()+fsync() | compress | device write | device sync | read() | decompress | write / none | read / none |"
        echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
        base_w=$(field "${R[$dev,z:none,write]:-${R[$dev,ext4,write]}}" mean)
        base_r=$(field "${R[$dev,z:none,read]:-${R[$dev,ext4,read]}}" mean)
        for sys in "${systems[@]}"; do
            w=${R[$dev,$sys,write]}
            r=${R[$dev,$sys,read]}
            bw=$([[ $sys == btrfs:* ]] && field "${R[$dev,btrfs:none,write]}" mean || echo "$base_w")
            br=$([[ $sys == btrfs:* ]] && field "${R[$dev,btrfs:none,read]}" mean || echo "$base_r")
            [ "$sys" = ext4 ] && bw=$(field "$w" mean) && br=$(field "$r" mean)
            printf '| %s | %s (%s, %s) | %s | %s | %s | %s (%s, %s) | %s | %.2f | %.2f |\n' \
                "$sys" "$(field "$w" mean)" "$(field "$w" p50)" "$(field "$w" p99)" \
                "${R[$dev,$sys,compress]:--}" "${R[$dev,$sys,devwrite]:--}" "${R[$dev,$sys,devsync]:--}" \
                "$(field "$r" mean)" "$(field "$r" p50)" "$(field "$r" p99)" "${R[$dev,$sys,decompress]:--}" \
                "$(python3 -c "print($(field "$w" mean) / max($bw, 1))")" "$(python3 -c "print($(field "$r" mean) / max($br, 1))")"
        done
    done
    echo
    echo "Ratios: zlogfs codecs to zlogfs none, btrfs zlib to btrfs none, ext4 to itself."
} | tee "$out"
echo "written to $out" >&2
