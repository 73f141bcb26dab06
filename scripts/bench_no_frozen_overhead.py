#!/usr/bin/env python3
"""Cost of the series for a model with no frozen parameter, against pristine v0.19.2, on CPU or GPU.

The series' hooks must cost a model without frozen parameters (full finetuning) next to nothing
(target: at most 1 % of the step). The model is host-bound on purpose, the worst case for hook
overhead: an embedding fed token ids (trainable, so its post-backward is armed by the series'
gradient-accumulated trigger) and 48 blocks of Linear -> LayerNorm -> Linear at hidden size 32,
ZeRO-3 with DeepSpeed's default settings, one process (world size 1, gloo, one torch thread),
with and without non-reentrant checkpointing of every block.

Each tree gets one long-lived process per mode, and the two take turns in blocks of --block steps,
--pairs times (ABBA; scripts/paired_blocks.py says why and how). Each block reports its CPU time per
step (time.process_time of that process: the time another process takes on the CPU does not count,
unlike wall time, which is printed too). The figure is the per-pair difference (tree - baseline) of
adjacent blocks: its median, its mean with a bootstrap 95 % interval, both relative to the
baseline's median step.

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
import os
import sys

from paired_blocks import BlockProcess, report, serve, take_turns

VOCAB, HIDDEN, DEPTH, BATCH, SEQ = 128, 32, 48, 4, 16


def child(checkpointing, warmup):
    """Builds the engine, runs ``warmup`` steps, then serves blocks of steps (paired_blocks.serve)."""
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

    def step():
        engine.backward(engine(ids))
        engine.step()

    for _ in range(warmup):
        step()
    serve(step, get_accelerator().synchronize, {"deepspeed": deepspeed.__file__})


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
    device = os.environ.setdefault("DS_ACCELERATOR", "cpu")
    print(f"model: embedding + {DEPTH} x (Linear-LayerNorm-Linear), hidden {HIDDEN}, no frozen parameter; "
          f"ZeRO-3 defaults, world size 1, one torch thread, DS_ACCELERATOR={device}; {how}, after {args.warmup} "
          "warm-up steps each")
    (baseline, _), (other, _) = trees
    for mode in modes:
        processes = [
            BlockProcess(label, tree, [os.path.abspath(__file__), "--child", mode, "--warmup",
                                       str(args.warmup)]) for label, tree in trees
        ]
        try:
            if args.profile:
                profiles = {process.label: process.profile(args.profile) for process in processes}
            else:
                blocks = take_turns(processes, args.pairs, args.block)
        finally:
            for process in processes:
                process.close()
        if args.profile:
            report_profile(mode, baseline, other, profiles, args.top)
            continue
        for clock in ("cpu_ms", "wall_ms"):
            report(f"checkpointing={mode}", baseline, other, blocks, clock)


if __name__ == "__main__":
    main()
