"""Every NBD command and flag zlogfs serves, through libnbd in strict
mode, then requests the protocol refuses: each gets an NBD error and the
connection stays healthy. Run by tests/nbd.rs: commands.py URI."""
import errno
import os
import sys

import nbd

MiB = 1 << 20
h = nbd.NBD()
h.set_strict_mode(nbd.STRICT_COMMANDS | nbd.STRICT_FLAGS | nbd.STRICT_BOUNDS | nbd.STRICT_ZERO_SIZE)
h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
h.connect_uri(sys.argv[1])
size = h.get_size()
assert h.can_fua() and h.can_flush() and h.can_trim() and h.can_zero() and h.can_fast_zero()
assert h.can_multi_conn() and h.can_df() and h.can_cache()
assert h.can_meta_context(nbd.CONTEXT_BASE_ALLOCATION)


def status(off, length):
    """(length, flags) extents of base:allocation from off."""
    out = []
    h.block_status(length, off, lambda meta, o, e, err: out.extend(zip(e[0::2], e[1::2])) or 0)
    return out


buf = os.urandom(64 * 1024)
# WRITE with FUA, READ, FLUSH.
h.pwrite(buf, MiB, nbd.CMD_FLAG_FUA)
assert h.pread(len(buf), MiB) == buf
h.flush()
assert status(MiB, 64 * 1024)[0] == (64 * 1024, 0), status(MiB, 64 * 1024)
# TRIM punches a hole: zeros, and a hole in the map.
h.trim(64 * 1024, MiB)
assert h.pread(len(buf), MiB) == bytes(len(buf))
assert status(MiB, 64 * 1024)[0][1] == 3, status(MiB, 64 * 1024)
# WRITE_ZEROES with NO_HOLE, then FAST_ZERO.
h.pwrite(buf, 2 * MiB)
h.zero(64 * 1024, 2 * MiB, nbd.CMD_FLAG_NO_HOLE)
assert h.pread(len(buf), 2 * MiB) == bytes(len(buf))
h.pwrite(buf, 2 * MiB)
h.zero(64 * 1024, 2 * MiB, nbd.CMD_FLAG_FAST_ZERO | nbd.CMD_FLAG_FUA)
assert h.pread(len(buf), 2 * MiB) == bytes(len(buf))
h.cache(4096, 0)
# BLOCK_STATUS over the whole export adds up to it; REQ_ONE gives one.
whole = []
off = 0
while off < size:
    got = status(off, min(size - off, 1 << 30))
    whole += got
    off += sum(e[0] for e in got)
assert off == size, (off, size)
one = []
h.block_status(size, 0, lambda meta, o, e, err: one.extend(e) or 0, nbd.CMD_FLAG_REQ_ONE)
assert len(one) == 2, one
# Refused requests, each an error, and the connection goes on.
h.set_strict_mode(0)
for name, call, want in [
    ("read past the end", lambda: h.pread(4096, size), errno.EINVAL),
    ("write past the end", lambda: h.pwrite(b"x" * 4096, size - 100), errno.ENOSPC),
    ("trim past the end", lambda: h.trim(4096, size), errno.ENOSPC),
    ("block status of 0 bytes", lambda: h.block_status(0, 0, lambda *a: 0), errno.EINVAL),
]:
    try:
        call()
        sys.exit(f"{name}: no error")
    except nbd.Error as e:
        # libnbd names the errno ("EINVAL").
        assert e.errno == errno.errorcode[want], (name, e.string, e.errno)
assert h.pread(len(buf), MiB) == bytes(len(buf))
h.pwrite(buf, 3 * MiB, nbd.CMD_FLAG_FUA)
assert h.pread(len(buf), 3 * MiB) == buf
h.shutdown()

# A second connection sees the first one's writes (multi-conn).
h2 = nbd.NBD()
h2.connect_uri(sys.argv[1])
assert h2.pread(len(buf), 3 * MiB) == buf
h2.shutdown()
print("ok")
