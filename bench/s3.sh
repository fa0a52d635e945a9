#!/usr/bin/env bash
# A tree through an S3 bucket (issue 30): zlogfs against s3fs and rclone
# mount, on one local S3 server (moto) in one run. Every client talks to
# the server through crates/s3/tests/proxy.py, which counts the requests
# by kind, so the counts are comparable.
#
# For each system: mount, `cp -r` the tree in, unmount (each flushes
# what it holds back; zlogfs uploads everything at unmount), then count
# PUT/GET/LIST/DELETE and the bytes the bucket holds. Then mount again
# and read every file back (tar to /dev/null): zlogfs twice, through an
# empty cache (another machine) and through the kept one (warm), beside
# the same read of a local zlogfs image file. Markdown on stdout.
#
#   bash bench/s3.sh                       # the Linux source tree
#   TREE=/usr/include bash bench/s3.sh     # quicker
#   SYSTEMS="zlogfs s3fs" bash bench/s3.sh
#
# Needs root, FUSE, s3fs and rclone (apt-get install s3fs rclone), and the
# moto venv test.sh makes (target/moto).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
[ "$(id -u)" = 0 ] || { echo "bench/s3.sh needs root (FUSE mounts, dropping caches)" >&2; exit 1; }
for t in s3fs rclone python3; do
    command -v $t >/dev/null || { echo "bench/s3.sh needs $t (apt-get install s3fs rclone)" >&2; exit 1; }
done
moto_bin=${ZLOGFS_MOTO_SERVER:-$PWD/target/moto/bin/moto_server}
[ -x "$moto_bin" ] || { echo "no moto server at $moto_bin: run ./test.sh once, or set ZLOGFS_MOTO_SERVER" >&2; exit 1; }
cargo build --release -q
z=$PWD/target/release/zlogfs
tree=${TREE:-$(linux_tree /var/tmp/zlogfs-bench)}
systems=${SYSTEMS:-"zlogfs s3fs rclone"}
work=$(mktemp -d /var/tmp/zlogfs-s3bench.XXXXXX)
m=$work/m
mkdir -p "$m"
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
mport=$(free_port)
pport=$(free_port)
"$moto_bin" -H 127.0.0.1 -p "$mport" >"$work/moto.log" 2>&1 &
moto_pid=$!
python3 crates/s3/tests/proxy.py "$pport" "$mport" >"$work/proxy.log" 2>&1 &
proxy_pid=$!
cleanup() {
    mountpoint -q "$m" && { umount "$m" 2>/dev/null || umount -l "$m"; }
    kill "$moto_pid" "$proxy_pid" 2>/dev/null || true
    [ -s "$work/rclone.log" ] && grep -m5 ERROR "$work/rclone.log" >&2
    rm -rf "$work"
}
trap cleanup EXIT
for p in "$mport" "$pport"; do
    for _ in $(seq 300); do
        python3 -c "import socket; socket.create_connection(('127.0.0.1', $p))" 2>/dev/null && break
        sleep 0.1
    done
done
endpoint=http://127.0.0.1:$pport
# The server speaks plain HTTP; a CA bundle in the environment makes rclone fail.
unset AWS_CA_BUNDLE
export AWS_ENDPOINT_URL=$endpoint AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench AWS_REGION=us-east-1
export RCLONE_CONFIG_B_TYPE=s3 RCLONE_CONFIG_B_PROVIDER=Other RCLONE_CONFIG_B_ENDPOINT=$endpoint \
    RCLONE_CONFIG_B_ACCESS_KEY_ID=bench RCLONE_CONFIG_B_SECRET_ACCESS_KEY=bench RCLONE_CONFIG_B_REGION=us-east-1
echo "bench:bench" >"$work/passwd"
chmod 600 "$work/passwd"
proxy() { python3 -c "import urllib.request, sys; print(urllib.request.urlopen('$endpoint' + sys.argv[1]).read().decode())" "$1"; }
count() { python3 -c "import json, sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$1" "$2"; }
stored() { # bucket: bytes of its objects
    rclone size "b:$1" --json 2>/dev/null | python3 -c 'import json, sys; print(json.load(sys.stdin)["bytes"])'
}
drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }
now() { date +%s.%N; }
unmount() {
    umount "$m" 2>/dev/null || fusermount3 -u "$m"
    # The daemons finish their uploads after the unmount returns.
    for _ in $(seq 600); do pgrep -f "$1" >/dev/null || break; sleep 0.1; done
}

mount_sys() { # system bucket [cache [extra zlogfs mount options]]
    case $1 in
    zlogfs) "$z" mount "s3://$2/img" "$m" -o "cache=$3${4:+,$4}" ;;
    s3fs) s3fs "$2" "$m" -o "url=$endpoint,use_path_request_style,passwd_file=$work/passwd" ;;
    # Files up to 64 MiB go up in one PUT: moto refuses rclone's streamed
    # multipart uploads.
    rclone) rclone mount "b:$2" "$m" --daemon --streaming-upload-cutoff 64M --log-file "$work/rclone.log" ;;
    esac
    for _ in $(seq 100); do mountpoint -q "$m" && return; sleep 0.1; done
    echo "$1 did not mount" >&2
    return 1
}
pattern() { case $1 in zlogfs) echo "zlogfs mount s3://$2" ;; s3fs) echo "s3fs $2" ;; rclone) echo "rclone mount b:$2" ;; esac; }

files=$(find "$tree" -type f | wc -l)
raw=$(du -sb "$tree" | cut -f1)
echo "# A tree through a bucket: zlogfs, s3fs, rclone mount ($(date -u +%F), commit $(git rev-parse --short HEAD))"
echo
echo "Tree: $tree ($files files, $raw bytes). Server: moto $("$(dirname "$moto_bin")/python" -c 'import moto; print(moto.__version__)') on 127.0.0.1, through the counting proxy."
echo
echo "| system | copy in + unmount (s) | PUT | GET | HEAD | LIST | DELETE | bytes stored | read back (s) | read GETs | entries refused |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
declare -A put_of stored_of
for sys in $systems; do
    bucket="b-$sys"
    python3 -c "import urllib.request as u; u.urlopen(u.Request('$endpoint/$bucket', method='PUT'))"
    cache=$work/cache-$sys
    [ "$sys" = zlogfs ] && "$z" mkfs "s3://$bucket/img" --cache "$cache" >/dev/null 2>&1
    proxy /__reset >/dev/null
    mount_sys "$sys" "$bucket" "$cache"
    t0=$(now)
    # cp -r: rclone mount cannot keep owners and modes (cp -a gets EIO),
    # nor make symbolic links: what a system refuses is counted, not fatal.
    cp -r "$tree" "$m/tree" 2>"$work/cp.err" || true
    refused=$(grep -c . "$work/cp.err" || true)
    unmount "$(pattern "$sys" "$bucket")"
    t1=$(now)
    s=$(proxy /__stats)
    put=$(count "$s" PUT)
    put=$((put + $(count "$s" POST)))
    bytes=$(stored "$bucket")
    put_of[$sys]=$put
    stored_of[$sys]=$bytes
    # Read back: zlogfs through an empty cache, read-only (another
    # machine's view: a writer there would take the image over, and the
    # writer's own cache would no longer be warm); the read GETs count
    # from the mount on.
    [ "$sys" = zlogfs ] && cache=$work/cache-empty
    drop
    proxy /__reset >/dev/null
    mount_sys "$sys" "$bucket" "$cache" ro
    t2=$(now)
    tar -C "$m" -cf - tree 2>/dev/null | cat >/dev/null
    t3=$(now)
    rs=$(proxy /__stats)
    unmount "$(pattern "$sys" "$bucket")"
    printf '| %s | %.1f | %s | %s | %s | %s | %s | %s | %.1f | %s | %s |\n' "$sys" "$(echo "$t1 - $t0" | bc)" "$put" \
        "$(count "$s" GET)" "$(count "$s" HEAD)" "$(count "$s" LIST)" "$(count "$s" DELETE)" "$bytes" \
        "$(echo "$t3 - $t2" | bc)" "$(count "$rs" GET)" "$refused"
done
if [[ " $systems " == *" zlogfs "* ]]; then
    # Warm: the writer's own cache, against a local image file.
    drop
    mount_sys zlogfs b-zlogfs "$work/cache-zlogfs"
    t0=$(now)
    tar -C "$m" -cf - tree | cat >/dev/null
    t1=$(now)
    unmount "zlogfs mount s3://b-zlogfs"
    "$z" mkfs "$work/local.img" --size 8G >/dev/null 2>&1
    "$z" mount "$work/local.img" "$m"
    cp -a "$tree" "$m/tree"
    umount "$m"
    sleep 1
    drop
    "$z" mount "$work/local.img" "$m"
    t2=$(now)
    tar -C "$m" -cf - tree | cat >/dev/null
    t3=$(now)
    umount "$m"
    warm=$(echo "$t1 - $t0" | bc)
    local_t=$(echo "$t3 - $t2" | bc)
    echo
    printf 'Read back through the warm cache: %.1f s; a local image file: %.1f s; ratio %.2f (target at most 1.2).\n' \
        "$warm" "$local_t" "$(echo "$warm / $local_t" | bc -l)"
    compressed=$(python3 -c "print(${stored_of[zlogfs]})")
    echo
    printf 'zlogfs: %d PUTs for %d bytes stored: %.1f MiB per PUT (target: at most one PUT per 4 MiB plus a bounded number per checkpoint).\n' \
        "${put_of[zlogfs]}" "$compressed" "$(echo "$compressed / 1048576 / ${put_of[zlogfs]}" | bc -l)"
    for peer in s3fs rclone; do
        [ -n "${put_of[$peer]:-}" ] || continue
        printf '%s / zlogfs: %.0f times the PUTs, %.2f times the bytes stored (targets: at least 100, at least 3).\n' \
            "$peer" "$(echo "${put_of[$peer]} / ${put_of[zlogfs]}" | bc -l)" \
            "$(echo "${stored_of[$peer]} / ${stored_of[zlogfs]}" | bc -l)"
    done
fi
