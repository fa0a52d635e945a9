"""Writes that were flushed survive a kill -9 of the server. Run by
tests/nbd.rs: crash.py write URI SEED prints "flushed N" after each flush
(N writes covered) until the server dies under it; crash.py verify URI
SEED N checks that the first N writes read back (a later write to the
same block may have replaced one: the newest of the first N is what must
be there, or a later one)."""
import random
import sys

import nbd

mode, uri, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
BLOCKS = 4096  # 16 MiB of 4 KiB blocks


def writes(seed):
    """(offset block, payload) of write i, for ever."""
    rng = random.Random(seed)
    i = 0
    while True:
        b = rng.randrange(BLOCKS)
        yield b, (b"%08d:%08d:" % (i, b)) * 227 + bytes(4096 - 18 * 227)
        i += 1


h = nbd.NBD()
h.connect_uri(uri)
if mode == "write":
    for i, (b, data) in enumerate(writes(seed)):
        flags = nbd.CMD_FLAG_FUA if i % 10 == 9 else 0
        h.pwrite(data, b * 4096, flags)
        if flags:
            print("flushed", i + 1, flush=True)
        if i % 50 == 49:
            h.flush()
            print("flushed", i + 1, flush=True)
else:
    n = int(sys.argv[4])
    newest = {}
    later = {}
    gen = writes(seed)
    for i in range(n):
        b, data = next(gen)
        newest[b] = data
    # What the writes after the first n (up to where the writer can have
    # got) put in each block: also acceptable.
    for i in range(200_000):
        b, data = next(gen)
        later.setdefault(b, set()).add(data)
    for b, data in newest.items():
        got = h.pread(4096, b * 4096)
        assert got == data or got in later.get(b, ()), f"block {b}: not the flushed write nor a later one"
    print("ok", len(newest))
h.shutdown()
