#!/usr/bin/env bash
# Applications on a file system over a volume (issue 27; ZBD measured
# PostMark and TPC-C): ext4 made on a kernel block device over each export
# (nbdfuse shows the export as a file, a loop device makes it a block
# device: this kernel has no nbd module), then PostMark (Debian's
# postmark: small files created, read, appended and deleted, a mail
# server's load) and pgbench (PostgreSQL 15's TPC-B-like load) on it, for
# zlogfs and `nbdkit file` on btrfs zstd:1 and on ext4, and for ext4 on a
# loop device over a raw file (`raw`: no NBD, no compression), in the
# same run; then the bytes each host stores for the volume.
#
#   bash bench/nbd-apps.sh
#
# SYSTEMS as for bench/nbd.sh, and raw (default "zlogfs raw ext4 btrfs"); PM_FILES and
# PM_TX PostMark's files and transactions (default 50000 and 200000);
# PGSCALE pgbench's scale (default 50, about 750 MB), PGTIME its seconds
# (default 60), with 4 clients. Writes a Markdown table to
# bench/results/nbd-apps-DATE.md (or OUT). Needs root; installs postmark,
# nbdkit, libnbd-bin and postgresql when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
need_tools nbdkit:nbdkit nbdfuse:libnbd-bin postmark:postmark mkfs.btrfs:btrfs-progs \
    /usr/lib/postgresql/15/bin/initdb:postgresql-15
pgbin=/usr/lib/postgresql/15/bin
pm_files=${PM_FILES:-50000}
pm_tx=${PM_TX:-200000}
pgscale=${PGSCALE:-50}
pgtime=${PGTIME:-60}
cargo build --release -q
z=$PWD/target/release/zlogfs
work=$(mktemp -d /var/tmp/zlogfs-nbdapps.XXXXXX)
chmod 755 "$work"
mkdir -p "$work/host" "$work/fuse" "$work/fs"
loop=""
dev=""
server=""
sock=$work/sock
. bench/nbd-lib.sh

# The volume as a kernel block device with ext4 on it, at $work/fs.
attach() {
    if [ "$1" = raw ]; then
        truncate -s 16G "$work/raw.img"
        dev=$(losetup -f --show --direct-io=on "$work/raw.img")
        mkfs.ext4 -q -F -E nodiscard "$dev"
        mount "$dev" "$work/fs"
        return
    fi
    nbdfuse -P "$work/nbdfuse.pid" "$work/fuse/vol" --unix "$sock" &
    for _ in $(seq 100); do [ -f "$work/nbdfuse.pid" ] && break; sleep 0.1; done
    dev=$(losetup -f --show --direct-io=on "$work/fuse/vol")
    mkfs.ext4 -q -F -E nodiscard "$dev"
    mount "$dev" "$work/fs"
}
detach() {
    mountpoint -q "$work/fs" && umount "$work/fs"
    [ -n "$dev" ] && losetup -d "$dev"
    dev=""
    mountpoint -q "$work/fuse" && fusermount3 -u "$work/fuse"
    rm -f "$work/nbdfuse.pid"
    sleep 0.5
}
cleanup() {
    [ -d "$work/fs/pg" ] && su postgres -s /bin/sh -c "$pgbin/pg_ctl -D $work/fs/pg stop -m immediate" >/dev/null 2>&1
    detach || true
    [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null
    mountpoint -q "$work/host" && umount "$work/host"
    [ -n "$loop" ] && losetup -d "$loop" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

# PostMark's whole run on $work/fs, its files written out to the volume
# (syncfs) before the clock stops: files per second (created, read or
# appended, and deleted, each counted once). PostMark's own figures count
# whole seconds of a run that is mostly in the page cache.
postmark_rate() {
    mkdir -p "$work/fs/pm"
    printf '%s\n' "set location $work/fs/pm" "set number $pm_files" "set transactions $pm_tx" \
        "set size 500 16384" "set read 4096" "set write 4096" "run" "quit" >"$work/pm.cfg"
    local t0 t1
    t0=$(date +%s.%N)
    postmark "$work/pm.cfg" >/dev/null
    sync -f "$work/fs"
    t1=$(date +%s.%N)
    python3 -c "print('%.0f' % (($pm_files + $pm_tx) / ($t1 - $t0)))"
}

# pgbench's TPS (4 clients) on a cluster made in $work/fs/pg.
pgbench_tps() {
    mkdir -p "$work/fs/pg" "$work/pgsock"
    chown postgres "$work/fs/pg" "$work/pgsock"
    local as="su postgres -s /bin/sh -c"
    $as "$pgbin/initdb -D $work/fs/pg -A trust" >/dev/null
    $as "$pgbin/pg_ctl -D $work/fs/pg -o '-k $work/pgsock -c listen_addresses=' -l $work/pgsock/pg.log -w start" >/dev/null
    $as "$pgbin/pgbench -h $work/pgsock -i -q -s $pgscale postgres" >/dev/null 2>&1
    $as "$pgbin/pgbench -h $work/pgsock -c 4 -j 2 -T $pgtime postgres" 2>/dev/null |
        sed -n 's/^tps = \([0-9.]*\).*/\1/p'
    $as "$pgbin/pg_ctl -D $work/fs/pg -w stop" >/dev/null
}

declare -A R
read -r -a systems <<<"${SYSTEMS:-zlogfs raw ext4 btrfs}"
for sys in "${systems[@]}"; do
    echo "== $sys" >&2
    [ "$sys" != raw ] && start "$sys" 16G
    attach "$sys"
    R[$sys,pm]=$(postmark_rate)
    rm -rf "$work/fs/pm"
    R[$sys,pg]=$(pgbench_tps)
    detach
    if [ "$sys" = raw ]; then
        R[$sys,space]=$(du -B1 "$work/raw.img" | cut -f1)
        rm -f "$work/raw.img"
        continue
    fi
    stop_server
    R[$sys,space]=$(used "$sys")
    stop
done

# Ratios to ext4 on a raw loop device, as the issue asks (ZBD's baseline).
base=raw
out=${OUT:-bench/results/nbd-apps-$(date -u +%F).md}
{
    echo "Machine: $(nproc) cores, kernel $(uname -r); $(date -u +%Y-%m-%dT%H:%MZ); commit $(git rev-parse --short HEAD)"
    echo "Command: ${SYSTEMS:+SYSTEMS=\"$SYSTEMS\" }bash bench/nbd-apps.sh; ext4 on a loop device (direct I/O) over nbdfuse over each export; PostMark $pm_files files, $pm_tx transactions, 500 B to 16 KiB; pgbench scale $pgscale, 4 clients, $pgtime s."
    echo
    table_head "${systems[@]}"
    table_row pm "PostMark, files + transactions per second, synced" "${systems[@]}"
    table_row pg "pgbench (TPS)" "${systems[@]}"
    table_row space "space used after both (bytes)" "${systems[@]}"
} | tee "$out"
echo "written to $out" >&2
