"""Two benchmark processes taking turns, and the paired difference of their step times.

Timing on a shared, contended host: comparing separate runs mixes the difference between two
configurations with the host's load, which changes from one run to the next by more than the few
per cent sought. So each side gets ONE long-lived process, both started before timing begins, and
the parent makes them take turns: a block of steps in one, then a block in the other, in the order
ABBA (A first in even pairs, B first in odd ones, so that a load trend favours neither). Only one
process runs at a time; the other waits on its pipe. The figure is the per-pair difference
(other - baseline) of adjacent blocks: its median, and its mean with a bootstrap 95 % interval
(fixed seed), both also relative to the baseline's median step.

The child side is ``serve(step, synchronize, ready)``: after its warm-up, a child prints
``READY <json>`` and then answers every line "N" read from stdin with ``BLOCK <json>``, the CPU
time (time.process_time of that process) and wall time per step of N steps; "profile N" runs N
steps under cProfile instead (``PROFILE <json>``); "quit" ends it. The parent side is
``BlockProcess`` (one child) and ``take_turns``; ``report`` prints the figures of one clock.

Used by scripts/bench_no_frozen_overhead.py and scripts/bench_lifecycle.py --pair.
"""

import json
import math
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import time


def serve(step, synchronize, ready):
    """The child's loop (see the module's docstring); READY carries the dict ``ready``."""
    import gc
    print("READY " + json.dumps(ready), flush=True)
    for line in sys.stdin:
        if line.strip() == "quit":
            return
        if line.startswith("profile "):
            print("PROFILE " + json.dumps(profile_steps(step, int(line.split()[1]))), flush=True)
            continue
        steps = int(line)
        gc.collect()  # a collection's cost lands in the block that triggers it, not by chance
        synchronize()
        start, start_cpu = time.perf_counter(), time.process_time()
        for _ in range(steps):
            step()
        synchronize()
        cpu, wall = time.process_time() - start_cpu, time.perf_counter() - start
        print("BLOCK " + json.dumps({"cpu_ms": 1e3 * cpu / steps, "wall_ms": 1e3 * wall / steps}), flush=True)


def profile_steps(step, steps):
    """cProfile of ``steps`` steps: per function ("file.py:name"), calls and own time per step."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        step()
    profiler.disable()
    per_function = {}
    for (path, _, name), (_, calls, own, _, _) in pstats.Stats(profiler).stats.items():
        # builtins are named with their object's address, which differs from one process to the next
        key = f"{os.path.basename(path)}:{name}" if path != "~" else re.sub(r" at 0x[0-9a-f]+", "", name)
        known_calls, known_own = per_function.get(key, (0, 0.0))
        per_function[key] = (known_calls + calls / steps, known_own + 1e3 * own / steps)
    return per_function


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class BlockProcess:
    """One child process, started with ``argv`` (a script run with sys.executable) and the tree's
    deepspeed/ first on PYTHONPATH, at world size 1. ``expect_tree``: the READY answer's
    "deepspeed" path must lie in the tree (checked, so that a stale install cannot stand in)."""

    def __init__(self, label, tree, argv, expect_tree=True):
        self.label, self.tree = label, tree
        env = dict(os.environ,
                   PYTHONPATH=os.path.abspath(tree) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                   MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(free_port()),
                   RANK="0",
                   LOCAL_RANK="0",
                   WORLD_SIZE="1",
                   LOCAL_SIZE="1")
        self.proc = subprocess.Popen([sys.executable, *argv],
                                     env=env,
                                     stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE,
                                     text=True)
        self.ready = self._answer("READY ")
        expected = os.path.join(os.path.abspath(tree), "deepspeed")
        if expect_tree and not self.ready.get("deepspeed", "").startswith(expected):
            self.close()
            sys.exit(f"bench: {tree} imported {self.ready.get('deepspeed')}, not the tree's own deepspeed/")

    def _answer(self, prefix):
        for line in self.proc.stdout:
            if line.startswith(prefix):
                return json.loads(line[len(prefix):])
        self.proc.wait()
        sys.exit(f"bench: the process of {self.label} ({self.tree}) ended (exit {self.proc.returncode}):\n"
                 f"{self.proc.stderr.read()[-3000:]}")

    def profile(self, steps):
        self.proc.stdin.write(f"profile {steps}\n")
        self.proc.stdin.flush()
        return self._answer("PROFILE ")

    def block(self, steps):
        self.proc.stdin.write(f"{steps}\n")
        self.proc.stdin.flush()
        return self._answer("BLOCK ")

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
            self.proc.wait(timeout=120)


def take_turns(processes, pairs, block):
    """``pairs`` pairs of ``block``-step blocks of the two processes, ABBA: {label: [block, ...]}."""
    blocks = {process.label: [] for process in processes}
    for pair in range(pairs):
        for process in (processes if pair % 2 == 0 else processes[::-1]):
            blocks[process.label].append(process.block(block))
    return blocks


def bootstrap_mean_interval(values, resamples=4000, seed=0):
    """95 % percentile interval of the mean of ``values``, by resampling with replacement."""
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(values, k=len(values))) for _ in range(resamples))
    return means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]


def report(title, baseline, other, blocks, clock):
    """Print the figures of one clock ("cpu_ms" or "wall_ms") under ``title``; returns them."""
    base = [b[clock] for b in blocks[baseline]]
    diffs = [o[clock] - b[clock] for b, o in zip(blocks[baseline], blocks[other])]
    base_median = statistics.median(base)
    q1, _, q3 = statistics.quantiles(diffs, n=4)
    low, high = bootstrap_mean_interval(diffs)

    def pct(ms):
        return 100 * ms / base_median

    print(f"{title}, {clock.split('_')[0]} time per step, {len(diffs)} pairs:")
    for label in (baseline, other):
        values = [b[clock] for b in blocks[label]]
        qa, _, qb = statistics.quantiles(values, n=4)
        print(f"  {label:>10}: median {statistics.median(values):.2f} ms (IQR {qa:.2f} - {qb:.2f})")
    print(f"  {other} - {baseline}, per pair: median {statistics.median(diffs):+.3f} ms "
          f"({pct(statistics.median(diffs)):+.2f} %), IQR {q1:+.3f} .. {q3:+.3f} ms; mean "
          f"{statistics.fmean(diffs):+.3f} ms ({pct(statistics.fmean(diffs)):+.2f} %), bootstrap 95 % interval "
          f"{low:+.3f} .. {high:+.3f} ms ({pct(low):+.2f} .. {pct(high):+.2f} %)")
    ratios = [o[clock] / b[clock] for b, o in zip(blocks[baseline], blocks[other])]
    ratio = statistics.fmean(ratios)
    # a goal stated as a ratio (at most 1.03 x the baseline) is read from the ratio's own interval
    ratio_low, ratio_high = bootstrap_mean_interval(ratios)
    print(f"  {other} / {baseline}, mean of the per-pair ratios: {ratio:.4f}, bootstrap 95 % interval "
          f"{ratio_low:.4f} .. {ratio_high:.4f}")
    # the arithmetic mean of noisy ratios leans above the geometric one, which gives the same answer
    # whichever side is the baseline
    logs = [math.log(r) for r in ratios]
    log_low, log_high = bootstrap_mean_interval(logs)
    geometric = math.exp(statistics.fmean(logs))
    print(f"  {other} / {baseline}, geometric mean of the per-pair ratios: {geometric:.4f}, bootstrap 95 % "
          f"interval {math.exp(log_low):.4f} .. {math.exp(log_high):.4f}")
    return {
        "mean_ms": statistics.fmean(diffs),
        "interval_ms": (low, high),
        "base_median_ms": base_median,
        "ratio": ratio,
        "ratio_interval": (ratio_low, ratio_high),
        "geometric_ratio": geometric,
        "geometric_ratio_interval": (math.exp(log_low), math.exp(log_high))
    }
