#!/usr/bin/env python3
"""A synthetic tree of small files, as issue 45 measured: directories of
100 to 1,000 entries, half of the files under 4 KiB, the rest up to 64 KiB,
contents of words (compressible, not trivially).

    mktree.py DIR FILES [SEED [LARGEST]]

LARGEST (default 65536) caps the larger half's sizes.

Prints the seed; the same seed makes the same tree.
"""
import os
import random
import sys


def main():
    top, files = sys.argv[1], int(sys.argv[2])
    seed = int(sys.argv[3]) if len(sys.argv) > 3 else random.randrange(1 << 30)
    largest = int(sys.argv[4]) if len(sys.argv) > 4 else 65536
    print(f"mktree.py: {files} files under {top}, seed {seed}", file=sys.stderr)
    r = random.Random(seed)
    words = [bytes(r.choice(b"abcdefghijklmnopqrstuvwxyz") for _ in range(r.randrange(2, 10))) for _ in range(4096)]
    text = b" ".join(r.choice(words) for _ in range(40000))
    made, d = 0, 0
    while made < files:
        dirpath = os.path.join(top, f"d{d // 100:04d}", f"d{d:06d}")
        os.makedirs(dirpath, exist_ok=True)
        for i in range(min(r.randrange(100, 1001), files - made)):
            size = r.randrange(0, 4096) if r.random() < 0.5 else r.randrange(4096, max(largest, 4097))
            at = r.randrange(0, len(text) - size)
            with open(os.path.join(dirpath, f"f{i:04d}.txt"), "wb") as f:
                f.write(text[at:at + size])
            made += 1
        d += 1


if __name__ == "__main__":
    main()
