# Shared by bench/run-engine.sh and bench/papers.sh (sourced, POSIX sh).

# linux_xz: print the newest /usr/src/linux-source-*.tar.xz, installing
# Debian's linux-source package first if there is none.
linux_xz() {
    if ! ls /usr/src/linux-source-*.tar.xz >/dev/null 2>&1; then
        echo "installing linux-source (apt-get)..." >&2
        if [ "$(id -u)" -eq 0 ]; then sudo=; else sudo=sudo; fi
        $sudo apt-get update >&2
        $sudo apt-get install -y linux-source >&2
    fi
    ls /usr/src/linux-source-*.tar.xz | sort -V | tail -n 1
}

# linux_tree CACHE: the linux-source tree, unpacked once under CACHE/tree
# (where test.sh unpacks it too); print its path.
linux_tree() {
    xz=$(linux_xz)
    tree="$1/tree/$(basename "$xz" .tar.xz)"
    if [ ! -d "$tree" ]; then
        echo "unpacking $xz into $1/tree (once)..." >&2
        mkdir -p "$1/tree"
        tar -C "$1/tree" -xJf "$xz"
    fi
    echo "$tree"
}

# ext4_image_of TREE IMAGE MOUNTDIR: a 3 GiB ext4 image file holding a
# copy of TREE, made through a loop mount on MOUNTDIR (left unmounted).
ext4_image_of() {
    truncate -s 3G "$2"
    mkfs.ext4 -q -F "$2"
    mount -o loop "$2" "$3"
    cp -a "$1" "$3/"
    umount "$3"
}

# need_tools COMMAND:PACKAGE ...: install from Debian the packages whose
# command is missing.
need_tools() {
    pkgs=
    for t in "$@"; do
        command -v "${t%%:*}" >/dev/null 2>&1 || pkgs="$pkgs ${t#*:}"
    done
    if [ -n "$pkgs" ]; then
        echo "installing$pkgs (apt-get)..." >&2
        DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
        # shellcheck disable=SC2086 # one word per package
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $pkgs >&2
    fi
}

# linux_tar CACHE XZ: decompress XZ once into CACHE; print the tar's path.
linux_tar() {
    tar="$1/$(basename "$2" .xz)"
    if [ ! -s "$tar" ]; then
        echo "decompressing $2 to $tar..." >&2
        mkdir -p "$1"
        xz -dc -T0 "$2" > "$tar.tmp"
        mv "$tar.tmp" "$tar"
    fi
    echo "$tar"
}

# run_bench ROOT NAME: `cargo bench --bench NAME`, its Markdown output
# printed and written to ROOT/bench/results/NAME-<date>.md under a comment
# line naming the time, the commit and the machine.
run_bench() {
    mkdir -p "$1/bench/results"
    out="$1/bench/results/$2-$(date +%Y-%m-%d).md"
    tmp="$out.tmp"
    {
        echo "<!-- $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git -C "$1" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$1" diff --quiet HEAD -- src benches 2>/dev/null || echo ' (src or benches modified)'), $(nproc) cores, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1), command: bash bench/$(basename "$0") -->"
        echo
    } > "$tmp"
    cd "$1"
    # Build first so that compiler messages do not interleave with the tables.
    cargo bench --bench "$2" --no-run
    { rc=0; cargo bench --bench "$2" || rc=$?; echo "$rc" > "$tmp.rc"; } | tee -a "$tmp"
    rc=$(cat "$tmp.rc"); rm -f "$tmp.rc"
    if [ "$rc" -ne 0 ]; then
        echo "cargo bench failed ($rc); partial output left in $tmp" >&2
        exit "$rc"
    fi
    mv "$tmp" "$out"
    echo "written: $out" >&2
}

# median_spread: numbers on stdin (spaces or lines); print "median min max".
median_spread() {
    tr ' ' '\n' | grep . | sort -g | awk '{v[NR]=$1} END {m = (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2; printf "%s %s %s", m, v[1], v[NR]}'
}
