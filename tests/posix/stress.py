#!/usr/bin/env python3
"""Writers, readers and cleaning at once on a mounted zlogfs (issue 24, item 4).

    stress.py MOUNTPOINT SECONDS SEED [WRITERS] [READERS]

Each writer process owns a few files and keeps their contents in memory:
it creates, overwrites (4 KiB pieces, which zlogfs stores as patches, and
larger ones, some through O_DIRECT), appends, truncates down and up, and
deletes, and reads each file back after changing it, comparing the bytes.
Readers read any file, any time (a file may vanish under them; its bytes
are not checked there, the owner does that). The caller runs `zlogfs
clean MOUNTPOINT` in a loop beside it and fsck after the unmount.

Exit status 0 when every read matched, 1 with the first mismatch on
stderr. The seed is printed; a run replays its choices (not its timing).
"""

import mmap
import os
import random
import sys
import time
from multiprocessing import Process, Queue

FILES = 5
MAX_LEN = 3 << 20
PAGE = 4096


def noise(r, n):
    """Half runs of a byte, half random bytes: compressible, not trivially."""
    out = bytearray()
    while len(out) < n:
        k = min(r.randrange(1, 512), n - len(out))
        out += bytes([r.randrange(256)]) * k if r.random() < 0.5 else r.randbytes(k)
    return bytes(out)


def direct_write(path, off, data):
    """A page-aligned O_DIRECT write of `data` (a multiple of a page) at `off`."""
    fd = os.open(path, os.O_WRONLY | os.O_DIRECT)
    try:
        buf = mmap.mmap(-1, len(data))
        buf.write(data)
        os.pwrite(fd, buf, off)
        buf.close()
    finally:
        os.close(fd)


def writer(mnt, t, seconds, seed, errors):
    r = random.Random(seed * 1000 + t)
    files = {}
    end = time.monotonic() + seconds
    ops = 0
    while time.monotonic() < end:
        k = r.randrange(FILES)
        path = os.path.join(mnt, f"w{t}-{k}")
        model = files.get(k)
        what = f"seed {seed}: writer {t}, op {ops} on {path}"
        try:
            if model is None:
                open(path, "wb").close()
                files[k] = model = bytearray()
            else:
                op = r.randrange(10)
                if op <= 3 and model:
                    n = PAGE if r.random() < 0.7 else r.randrange(1, 96 << 10)
                    off = r.randrange(len(model)) // PAGE * PAGE
                    data = noise(r, n)
                    if n % PAGE == 0 and r.random() < 0.3:
                        direct_write(path, off, data)
                    else:
                        with open(path, "r+b") as f:
                            f.seek(off)
                            f.write(data)
                    if len(model) < off + n:
                        model.extend(bytes(off + n - len(model)))
                    model[off:off + n] = data
                elif op <= 5:
                    data = noise(r, r.randrange(1, 128 << 10))
                    with open(path, "ab") as f:
                        f.write(data)
                    model += data
                elif op <= 7:
                    n = r.randrange(len(model) + (64 << 10) + 1)
                    os.truncate(path, n)
                    del model[n:]
                    model.extend(bytes(n - len(model)))
                elif op == 8:
                    os.unlink(path)
                    del files[k]
                    model = None
                elif r.random() < 0.2:
                    fd = os.open(path, os.O_RDONLY)
                    os.fsync(fd)
                    os.close(fd)
            if model is not None and len(model) > MAX_LEN:
                os.truncate(path, 0)
                del model[:]
            if model is not None:
                with open(path, "rb") as f:
                    got = f.read()
                if got != bytes(model):
                    first = next((i for i, (a, b) in enumerate(zip(got, model)) if a != b), min(len(got), len(model)))
                    errors.put(f"{what}: read {len(got)} bytes, wrote {len(model)}; first difference at {first}")
                    return
        except OSError as e:
            errors.put(f"{what}: {e}")
            return
        ops += 1
    errors.put(None)


def reader(mnt, t, nw, seconds, seed, errors):
    r = random.Random(seed * 1000 + 100 + t)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        path = os.path.join(mnt, f"w{r.randrange(nw)}-{r.randrange(FILES)}")
        try:
            with open(path, "rb") as f:
                f.read()
        except FileNotFoundError:
            pass
        except OSError as e:
            errors.put(f"seed {seed}: reader {t} on {path}: {e}")
            return
    errors.put(None)


def main():
    mnt, seconds, seed = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    nw = int(sys.argv[4]) if len(sys.argv) > 4 else 4
    nr = int(sys.argv[5]) if len(sys.argv) > 5 else 4
    print(f"stress.py: seed {seed}, {nw} writers, {nr} readers, {seconds} s", flush=True)
    errors = Queue()
    procs = [Process(target=writer, args=(mnt, t, seconds, seed, errors)) for t in range(nw)]
    procs += [Process(target=reader, args=(mnt, t, nw, seconds, seed, errors)) for t in range(nr)]
    for p in procs:
        p.start()
    failures = [e for e in (errors.get() for _ in procs) if e is not None]
    for p in procs:
        p.join()
    for e in failures:
        print(e, file=sys.stderr)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
