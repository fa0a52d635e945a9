#!/usr/bin/env python3
"""A slow device for bench/latency.sh: one file, served through FUSE, whose
reads and writes take as long as a device of a given bandwidth and
per-request latency would (flash-like: a few MB/s). A loop device on it is
a slow block device for every file system under test alike, which the
kernel's cgroup v1 blkio throttle cannot give (it does not reach
writeback, by which ext4, btrfs and zlogfs all write).

    slowdev.py BACKING MOUNTPOINT --write-bps N --read-bps N --latency-us N

The file appears as MOUNTPOINT/dev; its bytes live in BACKING. fsync
passes through (fdatasync of BACKING). Needs fusepy (a venv: pip install
fusepy) and libfuse2.
"""
import argparse
import errno
import os
import stat
import threading
import time

from fuse import FUSE, FuseOSError, Operations


class SlowDev(Operations):
    def __init__(self, backing, write_bps, read_bps, latency_us):
        self.fd = os.open(backing, os.O_RDWR)
        self.size = os.fstat(self.fd).st_size
        self.wbps = write_bps
        self.rbps = read_bps
        self.lat = latency_us / 1e6
        # One request at a time, as one flash chip serves them.
        self.mutex = threading.Lock()

    def _wait(self, start, n, bps):
        due = start + self.lat + n / bps
        left = due - time.monotonic()
        if left > 0:
            time.sleep(left)

    def getattr(self, path, fh=None):
        now = time.time()
        if path == "/":
            return dict(st_mode=stat.S_IFDIR | 0o755, st_nlink=2, st_atime=now, st_mtime=now, st_ctime=now)
        if path == "/dev":
            return dict(st_mode=stat.S_IFREG | 0o600, st_nlink=1, st_size=self.size,
                        st_atime=now, st_mtime=now, st_ctime=now)
        raise FuseOSError(errno.ENOENT)

    def readdir(self, path, fh):
        return [".", "..", "dev"]

    def open(self, path, flags):
        if path != "/dev":
            raise FuseOSError(errno.ENOENT)
        return 0

    def read(self, path, size, offset, fh):
        with self.mutex:
            t = time.monotonic()
            data = os.pread(self.fd, size, offset)
            self._wait(t, len(data), self.rbps)
            return data

    def write(self, path, data, offset, fh):
        with self.mutex:
            t = time.monotonic()
            n = os.pwrite(self.fd, data, offset)
            self._wait(t, n, self.wbps)
            return n

    def fsync(self, path, datasync, fh):
        os.fdatasync(self.fd)
        return 0

    def flush(self, path, fh):
        return 0

    def truncate(self, path, length, fh=None):
        raise FuseOSError(errno.EPERM)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("backing")
    p.add_argument("mountpoint")
    p.add_argument("--write-bps", type=float, default=4e6)
    p.add_argument("--read-bps", type=float, default=16e6)
    p.add_argument("--latency-us", type=float, default=200)
    a = p.parse_args()
    dev = SlowDev(a.backing, a.write_bps, a.read_bps, a.latency_us)
    # direct_io: every read and write reaches this process (no page cache
    # of the slow file in between: the loop device above has its own).
    FUSE(dev, a.mountpoint, foreground=True, nothreads=False, direct_io=True, allow_other=True)


if __name__ == "__main__":
    main()
