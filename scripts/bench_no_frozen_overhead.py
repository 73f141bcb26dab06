#!/usr/bin/env python3
"""Cost of the series for a model with no frozen parameter, against pristine v0.19.2, on CPU or GPU.

The series' hooks must cost a model without frozen parameters (full finetuning) next to nothing
(target: at most 1 % of the step). The model is host-bound on purpose, the worst case for hook
overhead: an embedding fed token ids (trainable, so its post-backward is armed by the series'
gradient-accumulated trigger) and 48 blocks of Linear -> LayerNorm -> Linear at hidden size 32,
ZeRO-3 with DeepSpeed's default settings, one process (world size 1, gloo, one torch thread),
with and without non-reentrant checkpointing of every block.

Timing on a shared, contended host: comparing separate runs of each tree mixes the difference
between the trees with the host's load, which changes from one run to the next by more than the
1 % sought. So each tree gets ONE long-lived process per mode, both started before timing begins,
and the parent makes them take turns: a block of --block steps in one, then a block in the other,
--pairs times, in the order ABBA (A first in even pairs, B first in odd ones, so that a load
trend does not favour either). Only one process runs at a time; the other waits on its pipe.
Each block reports its CPU time per step (time.process_time of that process: the time another
process takes on the CPU does not count, unlike wall time, which is printed too). The figure is
the per-pair difference (tree - baseline) of adjacent blocks: its median, its mean with a
bootstrap 95 % interval (fixed seed), and both relative to the baseline's median step.

    scripts/apply.sh v0.19.2 --pristine --dest build/deepspeed-v0.19.2-pristine
    scripts/apply.sh v0.19.2
    DS_ACCELERATOR=cpu python scripts/bench_no_frozen_overhead.py \\
        pristine=build/deepspeed-v0.19.2-pristine series=build/deepspeed-v0.19.2

Where the difference comes from: --profile STEPS runs STEPS steps of each tree under cProfile
instead and lists the functions whose calls per step differ (exact counts) and those whose own
time grew most (the profiler inflates Python-heavy code: use it to rank, not to measure).

Each tree's deepspeed/ package is put first on PYTHONPATH of its process (checked after import).
On a GPU host, DS_ACCELERATOR=cuda puts the model on the GPU (the same model, as host-bound as on
the CPU: the hooks' cost is not hidden behind kernels); each block then ends with a device
synchronize, and wall time is the figure to read (CPU time counts the host's spinning in that
synchronize too).

Nothing is installed or written. Exit status 0 whatever the figures: this reports, it does not
judge.
"""

import argparse
import json
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import time

VOCAB, HIDDEN, DEPTH, BATCH, SEQ = 128, 32, 48, 4, 16


def child(checkpointing, warmup):
    """Builds the engine, runs ``warmup`` steps, says READY, then runs a block of N steps for every
    "N" read from stdin and answers with its CPU and wall time per step; stops at "quit"."""
    import gc
    import torch
    from torch.utils.checkpoint import checkpoint
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from tests.harness.gloo import skip_shm_op_build
    # else each process JIT-compiles the shm op at init, for a minute, per tree (the include path
    # differs, so the build cache does not serve the other tree); training does not use it
    skip_shm_op_build()

    class Block(torch.nn.Module):

        def __init__(self):
            super().__init__()
            self.up = torch.nn.Linear(HIDDEN, HIDDEN)
            self.norm = torch.nn.LayerNorm(HIDDEN)
            self.down = torch.nn.Linear(HIDDEN, HIDDEN)

        def forward(self, x):
            return x + self.down(self.norm(self.up(x)))

    class Model(torch.nn.Module):

        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(VOCAB, HIDDEN)
            self.blocks = torch.nn.ModuleList(Block() for _ in range(DEPTH))

        def forward(self, ids):
            x = self.embed(ids)
            for block in self.blocks:
                x = checkpoint(block, x, use_reentrant=False) if checkpointing == "module" else block(x)
            return x.pow(2).mean()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Model()
    config = {
        "train_micro_batch_size_per_gpu": BATCH,
        "optimizer": {
            "type": "Adam",
            "params": {
                "lr": 1e-3,
                "torch_adam": True
            }
        },
        "zero_optimization": {
            "stage": 3
        },  # DeepSpeed's defaults for everything else
    }
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ)).to(engine.device)
    synchronize = get_accelerator().synchronize

    def step():
        engine.backward(engine(ids))
        engine.step()

    for _ in range(warmup):
        step()
    print("READY " + json.dumps({"deepspeed": deepspeed.__file__}), flush=True)
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


def report_profile(mode, baseline, other, profiles, top):
    """The functions whose calls per step differ between the trees, and those whose own time per
    step grew most (cProfile's time, inflated by the profiler itself: read it for ranking)."""
    a, b = profiles[baseline], profiles[other]
    rows = []
    for key in set(a) | set(b):
        (calls_a, own_a), (calls_b, own_b) = a.get(key, (0, 0.0)), b.get(key, (0, 0.0))
        rows.append((own_b - own_a, calls_b - calls_a, key, calls_a, calls_b))
    total_a, total_b = sum(v[1] for v in a.values()), sum(v[1] for v in b.values())
    print(f"checkpointing={mode}, cProfile, per step: own time {total_a:.2f} ms ({baseline}) vs {total_b:.2f} ms "
          f"({other}); functions by own-time growth (calls per step {baseline} -> {other}):")
    for grown, _, key, calls_a, calls_b in sorted(rows, reverse=True)[:top]:
        print(f"  {grown:+8.3f} ms  {calls_a:7.0f} -> {calls_b:7.0f} calls  {key}")
    changed = sorted((r for r in rows if round(r[1])), key=lambda r: -abs(r[1]))
    print(f"  call counts that differ ({len(changed)} functions):")
    for _, more, key, calls_a, calls_b in changed[:top]:
        print(f"  {more:+8.0f} calls  {calls_a:7.0f} -> {calls_b:7.0f}  {key}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TreeProcess:
    """One tree's child process for one checkpointing mode."""

    def __init__(self, label, tree, checkpointing, warmup):
        self.label, self.tree = label, tree
        env = dict(os.environ,
                   PYTHONPATH=os.path.abspath(tree) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                   DS_ACCELERATOR=os.environ.get("DS_ACCELERATOR", "cpu"),
                   MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(free_port()),
                   RANK="0",
                   LOCAL_RANK="0",
                   WORLD_SIZE="1",
                   LOCAL_SIZE="1")
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--child", checkpointing, "--warmup",
             str(warmup)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True)
        ready = self._answer("READY ")
        expected = os.path.join(os.path.abspath(tree), "deepspeed")
        if not ready["deepspeed"].startswith(expected):
            self.close()
            sys.exit(f"bench: {tree} imported {ready['deepspeed']}, not the tree's own deepspeed/")

    def _answer(self, prefix):
        for line in self.proc.stdout:
            if line.startswith(prefix):
                return json.loads(line[len(prefix):])
        self.proc.wait()
        sys.exit(f"bench: the process of {self.tree} ended (exit {self.proc.returncode}):\n"
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


def bootstrap_mean_interval(values, resamples=4000, seed=0):
    """95 % percentile interval of the mean of ``values``, by resampling with replacement."""
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(values, k=len(values))) for _ in range(resamples))
    return means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]


def report(mode, baseline, other, blocks, clock):
    base = [b[clock] for b in blocks[baseline]]
    diffs = [o[clock] - b[clock] for b, o in zip(blocks[baseline], blocks[other])]
    base_median = statistics.median(base)
    q1, _, q3 = statistics.quantiles(diffs, n=4)
    low, high = bootstrap_mean_interval(diffs)

    def pct(ms):
        return 100 * ms / base_median

    print(f"checkpointing={mode}, {clock.split('_')[0]} time per step, {len(diffs)} pairs:")
    for label in (baseline, other):
        values = [b[clock] for b in blocks[label]]
        qa, _, qb = statistics.quantiles(values, n=4)
        print(f"  {label:>10}: median {statistics.median(values):.2f} ms (IQR {qa:.2f} - {qb:.2f})")
    print(f"  {other} - {baseline}, per pair: median {statistics.median(diffs):+.3f} ms "
          f"({pct(statistics.median(diffs)):+.2f} %), IQR {q1:+.3f} .. {q3:+.3f} ms; mean "
          f"{statistics.fmean(diffs):+.3f} ms ({pct(statistics.fmean(diffs)):+.2f} %), bootstrap 95 % interval "
          f"{low:+.3f} .. {high:+.3f} ms ({pct(low):+.2f} .. {pct(high):+.2f} %)")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trees", nargs="*", metavar="LABEL=TREE", help="exactly two: the baseline first")
    parser.add_argument("--pairs", type=int, default=40, help="pairs of blocks per mode (default 40)")
    parser.add_argument("--block", type=int, default=5, help="steps per block (default 5)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps after building (default 5)")
    parser.add_argument("--checkpointing", default="none,module", help="modes, comma-separated (none, module)")
    parser.add_argument("--profile", type=int, default=0, metavar="STEPS",
                        help="instead of timing, profile STEPS steps of each tree with cProfile and print where "
                        "they differ: the exact calls per step of each function, and the own-time growth")
    parser.add_argument("--top", type=int, default=15, help="rows of the --profile listing (default 15)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.warmup)
        return
    if len(args.trees) != 2 or any("=" not in t for t in args.trees):
        parser.error("give exactly two LABEL=TREE arguments, the baseline first")
    trees = [t.split("=", 1) for t in args.trees]
    for label, tree in trees:
        if not os.path.isdir(os.path.join(tree, "deepspeed")):
            parser.error(f"{label}: {tree} has no deepspeed/ package")
    if args.pairs < 4 or args.block < 1:
        parser.error("--pairs must be at least 4 and --block at least 1")
    modes = args.checkpointing.split(",")
    unknown = set(modes) - {"none", "module"}
    if unknown:
        parser.error(f"--checkpointing: unknown mode(s) {sorted(unknown)}; expected none, module")
    how = (f"cProfile of {args.profile} steps per tree and mode" if args.profile else
           f"{args.pairs} pairs of {args.block}-step blocks per mode, the two trees' processes taking turns (ABBA)")
    device = os.environ.get("DS_ACCELERATOR", "cpu")
    print(f"model: embedding + {DEPTH} x (Linear-LayerNorm-Linear), hidden {HIDDEN}, no frozen parameter; "
          f"ZeRO-3 defaults, world size 1, one torch thread, DS_ACCELERATOR={device}; {how}, after {args.warmup} "
          "warm-up steps each")
    (baseline, _), (other, _) = trees
    for mode in modes:
        processes = [TreeProcess(label, tree, mode, args.warmup) for label, tree in trees]
        blocks = {label: [] for label, _ in trees}
        try:
            if args.profile:
                profiles = {process.label: process.profile(args.profile) for process in processes}
            else:
                for pair in range(args.pairs):
                    for process in (processes if pair % 2 == 0 else processes[::-1]):
                        blocks[process.label].append(process.block(args.block))
        finally:
            for process in processes:
                process.close()
        if args.profile:
            report_profile(mode, baseline, other, profiles, args.top)
            continue
        for clock in ("cpu_ms", "wall_ms"):
            report(mode, baseline, other, blocks, clock)


if __name__ == "__main__":
    main()
