#!/usr/bin/env python3
"""Each crate's test time, from the log of one `cargo test` run.

Usage: test-times.py LOG. Cargo prints `Running SRC (target/PROFILE/deps/
NAME-HASH)` before each test binary and libtest ends it with `test result:
... finished in 1.23s`; NAME is a target of one package (`cargo metadata`).
The sums are the binaries' run times (they run one after another), not
their build. A target name in two packages is reported, not guessed.
"""
import json
import re
import subprocess
import sys
from collections import defaultdict


def targets():
    """Target name (as in the executable's file name) -> package name."""
    meta = json.loads(subprocess.run(
        ["cargo", "metadata", "--no-deps", "--format-version", "1"],
        check=True, capture_output=True, text=True).stdout)
    owner = {}
    for p in meta["packages"]:
        for t in p["targets"]:
            if not set(t["kind"]) & {"lib", "bin", "test", "bench"}:
                continue
            name = t["name"].replace("-", "_")
            if owner.get(name, p["name"]) != p["name"]:
                print(f"test-times: target {name} is in {owner[name]} and {p['name']}; "
                      "its time counts to the first", file=sys.stderr)
                continue
            owner[name] = p["name"]
    return owner


def main():
    owner = targets()
    running = re.compile(r"^\s*Running .*\(.*/deps/(\w+)-[0-9a-f]+\)")
    finished = re.compile(r"^test result: .*finished in ([0-9.]+)s")
    per_crate = defaultdict(float)
    per_binary = []
    current = None
    with open(sys.argv[1], errors="replace") as log:
        for line in log:
            if m := running.match(line):
                current = m.group(1)
            elif (m := finished.match(line)) and current:
                secs = float(m.group(1))
                per_crate[owner.get(current, f"?{current}")] += secs
                per_binary.append((secs, current))
                current = None
    total = sum(per_crate.values())
    print(f"test time by crate ({total:.0f} s in all; run time, not build):")
    for crate, secs in sorted(per_crate.items(), key=lambda kv: -kv[1]):
        print(f"  {crate:16} {secs:7.1f} s")
    slow = ", ".join(f"{n} {s:.0f} s" for s, n in sorted(per_binary, reverse=True)[:5])
    print(f"  slowest binaries: {slow}")


if __name__ == "__main__":
    main()
