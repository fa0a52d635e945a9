# Shared by bench/nbd.sh and bench/nbd-apps.sh (sourced, bash): one
# export called "vol" on the Unix socket $sock, served by zlogfs or by
# `nbdkit file` over a file on ext4 or on btrfs zstd:1, each host file
# system on its own loop device over a sparse file in $work. Uses $z (the
# zlogfs binary), $work, $sock, and sets $server and $loop.
#
# A system is zlogfs, zlogfs:CHUNK or zlogfs:CHUNK:UNIT (volumes of CHUNK
# chunks in compression units of UNIT) or zlogfs:CHUNK:UNIT:COLD (and the
# cold form COLD, `--cold`, with / for the space: 512K/zstd:9 or none),
# ext4 or btrfs.

# start SYS VOLSIZE: a fresh export of VOLSIZE.
start() {
    rm -f "$sock"
    case $1 in
    zlogfs*)
        local chunk=() ch un co
        IFS=: read -r _ ch un co <<<"$1"
        [ -n "$ch" ] && chunk+=(--chunk-size "$ch")
        [ -n "$un" ] && chunk+=(--unit "$un")
        [ -n "$co" ] && chunk+=(--cold "${co//\// }")
        truncate -s 32G "$work/z.img"
        "$z" mkfs "$work/z.img" --size 32G --force >/dev/null 2>&1
        "$z" nbd "$work/z.img" --socket "$sock" --create "vol:$2" "${chunk[@]}" 2>/dev/null &
        ;;
    ext4 | btrfs)
        truncate -s 32G "$work/host.img"
        loop=$(losetup -f --show "$work/host.img")
        if [ "$1" = ext4 ]; then
            mkfs.ext4 -q -F "$loop"
            mount "$loop" "$work/host"
        else
            mkfs.btrfs -q -f "$loop" >/dev/null
            mount -o compress=zstd:1 "$loop" "$work/host"
        fi
        truncate -s "$2" "$work/host/vol"
        nbdkit -f -U "$sock" --exportname vol file "$work/host/vol" &
        ;;
    esac
    server=$!
    wait_socket
}

wait_socket() {
    for _ in $(seq 100); do [ -S "$sock" ] && return; sleep 0.1; done
    echo "the server did not make $sock" >&2
    return 1
}

# serve SYS: the server of the export made by start, started again.
serve() {
    rm -f "$sock"
    case $1 in
    zlogfs*) "$z" nbd "$work/z.img" --socket "$sock" 2>/dev/null & ;;
    *) nbdkit -f -U "$sock" --exportname vol file "$work/host/vol" & ;;
    esac
    server=$!
    wait_socket
}

# cold SYS: the server restarted and the page cache dropped, so that
# reads come from the device for every system.
cold() {
    stop_server
    sync
    echo 3 >/proc/sys/vm/drop_caches
    serve "$1"
}

# recompress SYS: for zlogfs, every segment cleaned, which stores the
# volume in its cold form (the server stopped; restarted by the caller).
recompress() {
    case $1 in
    zlogfs*)
        # A pass that stopped short (no room) would measure a partial form.
        "$z" clean "$work/z.img" --max-live 1 --json |
            python3 -c 'import json,sys; r=json.load(sys.stdin); sys.exit(r["stopped"] and "cold pass stopped: %s" % r["stopped"])'
        ;;
    esac
}

stop_server() {
    kill "$server"
    wait "$server" || true
    server=""
}

# stop: the server, the host file system and its image gone.
stop() {
    [ -n "$server" ] && stop_server
    mountpoint -q "$work/host" && umount "$work/host"
    [ -n "$loop" ] && losetup -d "$loop"
    loop=""
    rm -f "$work/z.img" "$work/host.img"
}

# used SYS: bytes the host stores for the export (the server stopped:
# zlogfs's image is the server's while it runs).
used() {
    case $1 in
    # What df counts: blocks only automatic points of history hold (the
    # cold pass's old copies) are free to writers.
    zlogfs*) "$z" stats "$work/z.img" --json | python3 -c 'import json,sys; j=json.load(sys.stdin); print(j["live_bytes"] - j["history_purgeable_bytes"])' ;;
    ext4) sync -f "$work/host/vol"; df -B1 --output=used "$work/host" | tail -n 1 ;;
    btrfs)
        sync -f "$work/host/vol"
        btrfs filesystem df -b "$work/host" | awk -F'used=' '/^(Data|Metadata|System)/ {split($2, a, " "); s += a[1]} END {print s}'
        ;;
    esac
}

# name SYS: the column title.
name() {
    case $1 in
    zlogfs) echo "zlogfs nbd" ;;
    zlogfs:*:*:*)
        local ch un co
        IFS=: read -r _ ch un co <<<"$1"
        echo "zlogfs nbd, $ch chunks in $un units, cold ${co//\// }"
        ;;
    zlogfs:*:*) local s=${1#zlogfs:}; echo "zlogfs nbd, ${s%%:*} chunks in ${s#*:} units" ;;
    zlogfs:*) echo "zlogfs nbd, ${1#zlogfs:} chunks" ;;
    ext4) echo "nbdkit file on ext4" ;;
    btrfs) echo "nbdkit file on btrfs zstd:1" ;;
    raw) echo "raw loop device" ;;
    *) echo "$1" ;;
    esac
}

# The systems compared with the base ($base, default btrfs), when it was
# measured.
ratio_systems() {
    local s
    case " $* " in *" ${base:-btrfs} "*) ;; *) return ;; esac
    for s in "$@"; do [ "$s" != "${base:-btrfs}" ] && echo "$s"; done
}

# table_head SYS...: a Markdown header, each system and then each one's
# ratio to the base.
table_head() {
    local head="| measure |" rule="|---|" s
    for s in "$@"; do head+=" $(name "$s") |"; rule+="---:|"; done
    for s in $(ratio_systems "$@"); do head+=" $(name "$s") / ${base:-btrfs} |"; rule+="---:|"; done
    echo "$head"
    echo "$rule"
}

# table_row KEY LABEL SYS...: the figures R[SYS,KEY], then the ratios.
table_row() {
    local key=$1 line="| $2 |" s
    shift 2
    for s in "$@"; do line+=" ${R[$s,$key]} |"; done
    for s in $(ratio_systems "$@"); do
        line+=" $(python3 -c "print('%.2f' % (${R[$s,$key]} / max(${R[${base:-btrfs},$key]}, 1e-9)))") |"
    done
    echo "$line"
}
