#!/usr/bin/env python3
"""Simulate greedy cleaning of a log of fixed-size blocks: the floor that
zlogfs's cleaner is measured against (docs/BENCHMARKS.md, issue 5).

A log of SEGMENTS segments of 1024 blocks (4 MiB of 4 KiB) holds UTIL of
its blocks live. Each write overwrites one live block at the log head;
when fewer than KEEP segments are free, the segment with the fewest live
blocks is cleaned (its live blocks copied to the head), until KEEP + BURST
are free. Prints the write amplification (blocks written / blocks the user
wrote) and how live the victims were, over the second half of the writes.

  python3 bench/cleansim.py --util 0.72 --order perm --burst 2
"""
import argparse
import random

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--segments", type=int, default=255)
p.add_argument("--util", type=float, default=0.72, help="live fraction of all blocks")
p.add_argument("--keep", type=int, default=6, help="clean when fewer segments are free")
p.add_argument("--burst", type=int, default=0, help="then clean until KEEP + BURST are free")
p.add_argument("--order", choices=["uniform", "perm"], default="uniform",
               help="uniform: any live block, repeats allowed; perm: each pass writes "
               "70%% of the blocks once, in random order (as fio's randwrite)")
p.add_argument("--heads", type=int, choices=[1, 2], default=1,
               help="2: the cleaner's copies go to their own log head")
p.add_argument("--pass-frac", type=float, default=0.7,
               help="with --order perm: the share of the live blocks each pass writes "
               "(1.0: every block once per pass, as fio over a whole file)")
p.add_argument("--policy", choices=["greedy", "cost-benefit"], default="greedy",
               help="cost-benefit: (1 - u) * age / (1 + u), age in writes since the "
               "segment was last written (as zlogfs's engine)")
p.add_argument("--writes", type=int, default=500_000)
p.add_argument("--seed", type=int, default=1)
a = p.parse_args()

B = 1024
S = a.segments
N = int(S * B * a.util)
rng = random.Random(a.seed)
print(f"seed {a.seed}")
loc = [None] * N            # block -> (segment, slot)
live = [0] * S
last = [0] * S            # segment -> clock at its last append
clock = 0
slots = [[] for _ in range(S)]
free = list(range(S))
heads = {"user": [free.pop(), 0], "clean": [free.pop(), 0]}


def append(b, who):
    h = heads[who if a.heads == 2 else "user"]
    if h[1] == B:
        h[0], h[1] = free.pop(), 0
    loc[b] = (h[0], h[1])
    slots[h[0]].append(b)
    live[h[0]] += 1
    last[h[0]] = clock
    h[1] += 1


for b in range(N):
    append(b, "user")

moved = writes = cleaned = victim_live = 0


def clean():
    global moved, cleaned, victim_live
    busy = {h[0] for h in heads.values()} | set(free)
    if a.policy == "greedy":
        score = lambda s: live[s]
    else:
        score = lambda s: -((B - live[s]) * max(clock - last[s], 1) / (B + live[s]))
    v = min((s for s in range(S) if s not in busy), key=score)
    victim_live += live[v]
    cleaned += 1
    keep = [b for i, b in enumerate(slots[v]) if loc[b] == (v, i)]
    slots[v], live[v] = [], 0
    free.insert(0, v)
    for b in keep:
        append(b, "clean")
        moved += 1


order = []
clock = 0
for i in range(a.writes):
    if len(free) < a.keep:
        while len(free) < a.keep + a.burst:
            clean()
    if a.order == "perm":
        if not order:
            order = list(range(N))
            rng.shuffle(order)
            order = order[: int(N * a.pass_frac)]
        b = order.pop()
    else:
        b = rng.randrange(N)
    s, _ = loc[b]
    live[s] -= 1
    loc[b] = None
    append(b, "user")
    writes += 1
    clock += 1
    if i == a.writes // 2:
        moved = writes = cleaned = victim_live = 0

print(f"write amplification {(writes + moved) / writes:.2f}, victims {victim_live / max(cleaned, 1) / B:.3f} live")
