#!/usr/bin/env python3
"""An offline model of zlogfs's packing for issue 47 (docs/decisions/2026-12-04-space-plan.md):
what pack size, order, frames, a dictionary and dedup would give on a tree, without
building any of them.

    python3 -m venv /var/tmp/z47 && /var/tmp/z47/bin/pip install zstandard
    nice -n19 /var/tmp/z47/bin/python bench/space-model.py TREE [--levels 3,9,19] [--blocks 128,1024,4096] [--frames 0,256]

Models zlogfs's packing. Pieces under 32 KiB go to packs: files under half a 64 KiB
chunk, and the tails of larger files (store.rs:208). Whole 64 KiB chunks get blocks
of their own.

Prints, as markdown:
- the duplicate share: whole small files, and 64 KiB chunks;
- for every order x block size x level x frame size x dictionary:
  - the packs' stored bytes and the tree's ratio (the chunks compressed per
    1 MiB unit at the same level);
  - compression MB/s on one core;
  - mean decode time of the unit a 4 KiB random read of a small file must
    decode;
  - decoded/logical bytes for a read-back in path order through a FIFO cache
    of 16 and 128 MiB.

Needs `pip install zstandard`. Memory: about the tree's small-file bytes, plus one block.
"""
import argparse, collections, hashlib, os, sys, time
import zstandard as zstd

SMALL, CHUNK, UNIT = 32 << 10, 64 << 10, 1 << 20


def walk(root):
    """Files in readdir order, depth first (roughly the creation order of cp -a): (path, size)."""
    out, stack = [], [root]
    while stack:
        d = stack.pop()
        try:
            ents = list(os.scandir(d))
        except OSError:
            continue
        subdirs = []
        for e in ents:
            try:
                if e.is_dir(follow_symlinks=False):
                    subdirs.append(e.path)
                elif e.is_file(follow_symlinks=False):
                    out.append((e.path, e.stat(follow_symlinks=False).st_size))
            except OSError:
                pass
        stack.extend(reversed(subdirs))
    return out


def sketch(data):
    """A cheap similarity key: the smallest hashes of the first 16 KiB's lines (min-hash)."""
    toks = set(data[:16384].split(b"\n"))
    hs = sorted(int.from_bytes(hashlib.blake2b(t, digest_size=8).digest(), "big") for t in toks if len(t) > 3)
    return tuple(hs[:2]) if hs else (0,)


def orders(pieces):
    ext = lambda p: os.path.splitext(p[0])[1].lower()
    yield "readdir", list(pieces)
    yield "path", sorted(pieces, key=lambda p: p[0])
    yield "ext+name", sorted(pieces, key=lambda p: (ext(p), os.path.basename(p[0]), p[0]))
    yield "similarity", sorted(pieces, key=lambda p: (ext(p), p[3], p[0]))


def blocks_of(pieces, bsize):
    """Cut ordered pieces into blocks of at most bsize raw bytes (pieces are not split), as pack_small."""
    cur, members, have = [], [], 0
    for n, p in enumerate(pieces):
        if cur and have + len(p[1]) > bsize:
            yield b"".join(cur), members
            cur, members, have = [], [], 0
        cur.append(p[1])
        members.append(n)
        have += len(p[1])
    if cur:
        yield b"".join(cur), members


def model(order, bsize, level, frame, dictd, path_rank):
    cz = zstd.ZstdCompressor(level=level, dict_data=dictd) if dictd else zstd.ZstdCompressor(level=level)
    dz = zstd.ZstdDecompressor(dict_data=dictd) if dictd else zstd.ZstdDecompressor()
    stored = raw = 0
    ctime = 0.0
    units = []  # (unit id, raw length, decode seconds) per decodable unit
    piece_units = {}  # piece index -> units it spans
    for blk, members in blocks_of(order, bsize):
        fsz = frame or len(blk)
        offs, o = [], 0
        for n in members:
            offs.append((n, o, o + len(order[n][1])))
            o += len(order[n][1])
        for f0 in range(0, len(blk), fsz):
            part = blk[f0:f0 + fsz]
            t = time.process_time()
            c = cz.compress(part)
            ctime += time.process_time() - t
            stored += min(len(c), len(part)) + (12 if frame else 0)
            t = time.process_time()
            dz.decompress(c, max_output_size=len(part))
            uid = len(units)
            units.append((uid, len(part), time.process_time() - t))
            for n, a, b in offs:
                if a < f0 + len(part) and b > f0:
                    piece_units.setdefault(n, []).append(uid)
        raw += len(blk)
    reads = [sum(units[u][2] for u in us[:1]) for us in piece_units.values()]  # a 4 KiB read: its first unit
    amp = {}
    for cache in (16 << 20, 128 << 20):
        fifo, held, have, decoded = collections.deque(), 0, set(), 0
        for n in sorted(range(len(order)), key=lambda n: path_rank[order[n][0]]):
            for u in piece_units.get(n, []):
                if u in have:
                    continue
                decoded += units[u][1]
                have.add(u); fifo.append(u); held += units[u][1]
                while held > cache:
                    v = fifo.popleft(); have.discard(v); held -= units[v][1]
        amp[cache] = decoded / max(raw, 1)
    return stored, raw, ctime, sum(reads) / max(len(reads), 1), amp


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tree")
    ap.add_argument("--levels", default="3,9,19")
    ap.add_argument("--blocks", default="128,1024,4096", help="KiB")
    ap.add_argument("--frames", default="0,256", help="KiB, 0 = the whole block is one frame")
    a = ap.parse_args()
    files = walk(a.tree)
    pieces, chunks, seen, dup_files, dup_chunks = [], [], set(), 0, 0
    chunk_seen = set()
    for path, size in files:
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            continue
        whole = len(data) // CHUNK * CHUNK if len(data) >= SMALL else 0
        tail = data[whole:]
        if len(tail) >= SMALL:  # a last chunk of at least half a chunk is a chunk of its own
            whole, tail = len(data), b""
        for o in range(0, whole, CHUNK):
            c = data[o:o + CHUNK]
            h = hashlib.blake2b(c, digest_size=16).digest()
            dup_chunks += len(c) if h in chunk_seen else 0
            chunk_seen.add(h)
            chunks.append(c)
        if tail:
            h = hashlib.blake2b(tail, digest_size=16).digest()
            if h in seen:
                dup_files += len(tail)
            seen.add(h)
            pieces.append((path, tail, h, sketch(tail)))
    small = sum(len(p[1]) for p in pieces)
    big = sum(len(c) for c in chunks)
    print(f"# {a.tree}\n\n{len(files)} files; packed pieces {small} B, whole chunks {big} B")
    print(f"duplicate bytes: packed pieces {dup_files} ({dup_files / max(small, 1):.1%}), "
          f"64 KiB chunks {dup_chunks} ({dup_chunks / max(big, 1):.1%})\n")
    path_rank = {p[0]: n for n, p in enumerate(sorted(pieces, key=lambda p: p[0]))}
    levels = [int(x) for x in a.levels.split(",")]
    # Whole chunks per 1 MiB unit of consecutive chunks (files' chunks are consecutive here).
    big_stored = {}
    for lv in levels:
        cz = zstd.ZstdCompressor(level=lv)
        joined = b"".join(chunks)
        big_stored[lv] = sum(len(cz.compress(joined[o:o + UNIT])) for o in range(0, len(joined), UNIT))
    sample = [p[1] for p in pieces[:: max(1, len(pieces) // 4000)]]
    dictd = zstd.train_dictionary(112640, sample) if len(sample) > 10 else None
    print("| order | dedup | block KiB | frame KiB | level | dict | packs stored | tree ratio | MB/s | "
          "4K read ms | amp 16M | amp 128M |")
    print("|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|")
    for dedup in (False, True):
        ps = pieces
        if dedup:
            s, ps = set(), []
            for p in pieces:
                if p[2] not in s:
                    s.add(p[2]); ps.append(p)
        for name, order in orders(ps):
            for b in [int(x) << 10 for x in a.blocks.split(",")]:
                for fr in [int(x) << 10 for x in a.frames.split(",")]:
                    if fr and fr >= b:
                        continue
                    for lv in levels:
                        for d in (None, dictd) if dictd else (None,):
                            st, raw, ct, rd, amp = model(order, b, lv, fr, d, path_rank)
                            bs = big_stored[lv] if not dedup else big_stored[lv] * (1 - dup_chunks / max(big, 1))
                            ratio = (small + big) / max(st + bs + (len(d.as_bytes()) if d else 0), 1)
                            print(f"| {name} | {'yes' if dedup else 'no'} | {b >> 10} | {fr >> 10} | {lv} | "
                                  f"{'yes' if d else 'no'} | {st} | {ratio:.2f} | {raw / max(ct, 1e-9) / 1e6:.1f} | "
                                  f"{rd * 1e3:.3f} | {amp[16 << 20]:.2f} | {amp[128 << 20]:.2f} |")
                            sys.stdout.flush()


if __name__ == "__main__":
    main()
