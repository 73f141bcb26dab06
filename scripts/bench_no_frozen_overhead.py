#!/usr/bin/env python3
"""Step time of a model with no frozen parameter, series against pristine v0.19.2, on CPU.

The series' hooks must cost a model without frozen parameters (full finetuning) next to nothing.
This times a host-bound model on one CPU process (world size 1, gloo): an embedding fed token ids
(trainable, so its post-backward is armed by the series' gradient-accumulated trigger) and 48
blocks of Linear -> LayerNorm -> Linear at hidden size 32, ZeRO-3 with DeepSpeed's default
settings, with and without non-reentrant checkpointing of every block. Each tree runs in its own
processes (its deepspeed/ package first on PYTHONPATH); runs of the trees are interleaved so that
a slow spell of a shared machine hits both.

    scripts/apply.sh v0.19.2 --pristine --dest build/deepspeed-v0.19.2-pristine
    scripts/apply.sh v0.19.2
    DS_ACCELERATOR=cpu python scripts/bench_no_frozen_overhead.py \\
        pristine=build/deepspeed-v0.19.2-pristine series=build/deepspeed-v0.19.2

Prints, per checkpointing mode and tree, the median step time of each run (median of --steps
steps after --warmup), their median and spread (max - min), and each tree's median relative to
the first tree's; once for wall-clock time and once for the process's CPU time. torch runs one
thread, so on a host shared with other work the CPU time is the steadier of the two.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

VOCAB, HIDDEN, DEPTH, BATCH, SEQ = 128, 32, 48, 4, 16


def child(checkpointing, steps, warmup):
    import torch
    from torch.utils.checkpoint import checkpoint
    import deepspeed

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
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    wall, cpu = [], []
    for step in range(warmup + steps):
        start, start_cpu = time.perf_counter(), time.process_time()
        engine.backward(engine(ids))
        engine.step()
        if step >= warmup:
            wall.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
    return {
        "deepspeed": deepspeed.__file__,
        "wall": 1e3 * statistics.median(wall),
        "cpu": 1e3 * statistics.median(cpu),
    }


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_tree(tree, checkpointing, steps, warmup):
    env = dict(os.environ,
               PYTHONPATH=os.path.abspath(tree) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               DS_ACCELERATOR=os.environ.get("DS_ACCELERATOR", "cpu"),
               MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()),
               RANK="0",
               LOCAL_RANK="0",
               WORLD_SIZE="1",
               LOCAL_SIZE="1")
    out = subprocess.run([
        sys.executable, __file__, "--child", checkpointing, "--steps",
        str(steps), "--warmup",
        str(warmup)
    ],
                         env=env,
                         capture_output=True,
                         text=True)
    result = next((line for line in out.stdout.splitlines() if line.startswith("RESULT ")), None)
    if out.returncode or result is None:
        sys.exit(f"bench: the run of {tree} ({checkpointing}) failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    result = json.loads(result[len("RESULT "):])
    expected = os.path.join(os.path.abspath(tree), "deepspeed")
    if not result["deepspeed"].startswith(expected):
        sys.exit(f"bench: {tree} imported {result['deepspeed']}, not the tree's own deepspeed/")
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trees", nargs="*", metavar="LABEL=TREE")
    parser.add_argument("--runs", type=int, default=3, help="runs per tree and mode (default 3)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per run (default 20)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    parser.add_argument("--checkpointing", default="none,module", help="modes, comma-separated (none, module)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args.steps, args.warmup)), flush=True)
        return
    if len(args.trees) < 2 or any("=" not in t for t in args.trees):
        parser.error("give at least two LABEL=TREE arguments, the baseline first")
    trees = [t.split("=", 1) for t in args.trees]
    for label, tree in trees:
        if not os.path.isdir(os.path.join(tree, "deepspeed")):
            parser.error(f"{label}: {tree} has no deepspeed/ package")
    modes = args.checkpointing.split(",")
    print(f"model: embedding + {DEPTH} x (Linear-LayerNorm-Linear), hidden {HIDDEN}, no frozen parameter; "
          f"ZeRO-3 defaults, world size 1; {args.runs} interleaved runs x median of {args.steps} steps "
          f"(after {args.warmup} warm-up)")
    for mode in modes:
        results = {label: [] for label, _ in trees}
        for run in range(args.runs):
            for label, tree in trees:
                results[label].append(run_tree(tree, mode, args.steps, args.warmup))
        for clock in ("wall", "cpu"):
            base = statistics.median(r[clock] for r in results[trees[0][0]])
            print(f"checkpointing={mode}, {clock} time per step")
            for label, _ in trees:
                runs = [r[clock] for r in results[label]]
                median = statistics.median(runs)
                print(f"  {label:>10}: runs {' / '.join(f'{m:.1f}' for m in runs)} ms; median {median:.1f} ms, "
                      f"spread {max(runs) - min(runs):.1f} ms; {100 * (median / base - 1):+.1f} % vs {trees[0][0]}")


if __name__ == "__main__":
    main()
