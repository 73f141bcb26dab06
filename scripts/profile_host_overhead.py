#!/usr/bin/env python3
"""Where the host time of a ZeRO-3 training step goes, per Python function, on CPU.

The GPU benchmark (scripts/bench_lifecycle.py) at 4 sequences per GPU is bound by the host:
its step time is mostly Python in hooks. This profiles the same model structure (a Llama with
PEFT LoRA on q/k/v/o, built under deepspeed.zero.Init), shrunk so that it runs on a CPU, in one
process (world size 1, gloo), and records cProfile's own time per function for the forward and
for the backward, per step. Times are the main thread's CPU time (time.thread_time), so that other
load on the machine does not inflate them, and so is each step's time; torch runs one intra-op
thread. Comparing runs of two variants (several runs each: per-function times are medians over a
variant's runs, totals show their range) shows which functions make one slower:

    PYTHONPATH=<patched tree> DS_ACCELERATOR=cpu python scripts/profile_host_overhead.py \\
        --variant series --out build/host/series.json
    PYTHONPATH=<pristine tree> DS_ACCELERATOR=cpu python scripts/profile_host_overhead.py \\
        --variant reentrant --out build/host/reentrant.json
    python scripts/profile_host_overhead.py --compare build/host/series*.json build/host/reentrant*.json \\
        --md docs/_generated/host-overhead.md
"""

import argparse
import cProfile
import json
import os
import pathlib
import pstats
import re
import statistics
import sys
import time

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, SCRIPTS)
sys.path.insert(0, os.path.dirname(SCRIPTS))

from bench_lifecycle import VARIANTS, build_engine  # noqa: E402  (the benchmark's engine, at CPU size)

sys.path.insert(0, os.path.join(os.path.dirname(SCRIPTS), "docs", "_ext"))
import stamps  # noqa: E402

SERIES = os.path.join(os.path.dirname(SCRIPTS), "patches", "v0.19.2")


def relative_path(path):
    """A profiled file's path relative to its package or to the standard library, so that no
    directory of the machine that made the profile reaches the docs."""
    path = re.sub(r"^.*/(site-packages|deepspeed-[^/]+|ds)/(?=deepspeed/|torch/|transformers/|peft/)", "", path)
    path = re.sub(r"^.*/lib/python\d+\.\d+/(?!site-packages/)", "stdlib/", path)
    path = re.sub(r"^.*/site-packages/", "", path)
    if path.startswith("/"):  # anything else: the file and its directory only
        path = "/".join(path.split("/")[-2:])
    return path


def function_name(key):
    """'file(function)' without the installation-specific directories."""
    path, line, function = key
    return f"{relative_path(path)}({function})" if path != "~" else function


def sanitized(name):
    """function_name() applied to a name recorded by an older version of this script."""
    match = re.match(r"^(/[^(]*)\((.*)\)$", name)
    return f"{relative_path(match.group(1))}({match.group(2)})" if match else name


def own_time_per_step(profile, steps):
    stats = pstats.Stats(profile)
    return {function_name(key): value[2] / steps for key, value in stats.stats.items()}


def run(args):
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29700 + os.getpid() % 200))
    import torch
    # One intra-op thread: with several, the main thread's CPU time includes OpenMP's spin-waiting for
    # the others, which varies with the machine's load (measured: 2-3x between runs of one tree).
    torch.set_num_threads(1)
    import deepspeed
    from tests.harness.gloo import skip_shm_op_build
    skip_shm_op_build()
    deepspeed.init_distributed(dist_backend="gloo")
    engine = build_engine(args)
    ids = torch.randint(0, 32000, (args.batch, args.seq), generator=torch.Generator().manual_seed(0))
    profiles = {"forward": cProfile.Profile(time.thread_time), "backward": cProfile.Profile(time.thread_time)}
    seconds = {"forward": [], "backward": []}
    for step in range(args.warmup + args.steps):
        measured = step >= args.warmup
        start = time.thread_time()
        if measured:
            profiles["forward"].enable()
        loss = engine(input_ids=ids, labels=ids).loss
        if measured:
            profiles["forward"].disable()
            profiles["backward"].enable()
        middle = time.thread_time()
        engine.backward(loss)
        if measured:
            profiles["backward"].disable()
            seconds["forward"].append(middle - start)
            seconds["backward"].append(time.thread_time() - middle)
        engine.step()
    tree = os.path.basename(os.environ.get("PYTHONPATH", "").rstrip("/")) or "installed deepspeed"
    result = {
        "stamp": stamps.make(pathlib.Path(SERIES), deepspeed.__version__.strip(), [tree],
                             run_command(args.variant, tree)),
        "variant": args.variant,
        "tree": tree,
        "deepspeed": deepspeed.__version__.strip(),
        "torch": torch.__version__,
        "shape": {k: getattr(args, k) for k in ("layers", "hidden", "seq", "batch")},
        "steps": args.steps,
        "timer": "thread_time",
        "median_s": {phase: statistics.median(values) for phase, values in seconds.items()},
        "own_s_per_step": {phase: own_time_per_step(profile, args.steps)
                           for phase, profile in profiles.items()},
    }
    engine.destroy()
    deepspeed.comm.destroy_process_group()
    with open(args.out, "w") as out:
        json.dump(result, out, indent=1)
    print(f"{args.variant}: median forward {result['median_s']['forward']:.4f} s, "
          f"backward {result['median_s']['backward']:.4f} s (main-thread CPU time, profiled)")


def merged(own):
    """Per-function times keyed without object addresses ("<built-in method __new__ of type object at
    0x...>"), which differ between the two runs and would keep the same function apart."""
    result = {}
    for name, seconds in own.items():
        name = sanitized(re.sub(r" at 0x[0-9a-f]+", "", name))
        result[name] = result.get(name, 0.0) + seconds
    return result


def by_variant(paths):
    """The runs grouped by variant, in the order the variants first appear; exactly two variants."""
    groups = {}
    for path in paths:
        run = json.load(open(path))
        if run.get("timer") != "thread_time":
            sys.exit(f"profile_host_overhead.py: {path} was recorded with wall-clock timing by an older version "
                     "of this script: record it again")
        groups.setdefault(run["variant"], []).append(run)
    if len(groups) != 2:
        sys.exit(f"profile_host_overhead.py: --compare needs runs of exactly two variants, got {sorted(groups)}")
    return list(groups.values())


def runs(n):
    return f"{n} run" if n == 1 else f"{n} runs"


def spread(values, scale=1e3):
    """'median [min-max]' in ms, or the single value."""
    values = [v * scale for v in values]
    if len(values) == 1:
        return f"{values[0]:.1f}"
    return f"{statistics.median(values):.1f} [{min(values):.1f}-{max(values):.1f}]"


def run_command(variant, tree):
    """The command that makes one run of ``variant`` with ``tree`` first on PYTHONPATH."""
    return f"PYTHONPATH=build/{tree} DS_ACCELERATOR=cpu scripts/profile_host_overhead.py --variant {variant}"


def compare(paths, md_path, rows):
    runs_a, runs_b = by_variant(paths)
    a, b = runs_a[0], runs_b[0]
    lines = [
        f"Host time per step under cProfile, {a['variant']} ({runs(len(runs_a))}) vs {b['variant']} "
        f"({runs(len(runs_b))}): main-thread CPU time, torch {a['torch']}, CPU, world size 1; Llama "
        f"{a['shape']['layers']} layers, hidden {a['shape']['hidden']}, sequence {a['shape']['seq']}, batch "
        f"{a['shape']['batch']}, LoRA on q/k/v/o, bf16; {a['steps']} profiled steps per run. Totals and step times "
        "are medians over the runs [min-max]; per-function times are medians over the runs.",
        "",
    ]
    for phase in ("forward", "backward"):
        own_a = [merged(r["own_s_per_step"][phase]) for r in runs_a]
        own_b = [merged(r["own_s_per_step"][phase]) for r in runs_b]
        names = set().union(*own_a, *own_b)
        med_a = {n: statistics.median(o.get(n, 0.0) for o in own_a) for n in names}
        med_b = {n: statistics.median(o.get(n, 0.0) for o in own_b) for n in names}
        lines += [
            f"**{phase.capitalize()}**: {spread([sum(o.values()) for o in own_a])} ms vs "
            f"{spread([sum(o.values()) for o in own_b])} ms of profiled own time per step (step medians "
            f"{spread([r['median_s'][phase] for r in runs_a])} ms vs {spread([r['median_s'][phase] for r in runs_b])} "
            "ms). The functions that differ most:",
            "",
            f"| function | {a['variant']} (ms/step) | {b['variant']} (ms/step) | difference |",
            "|---|---|---|---|",
        ]
        for name in sorted(names, key=lambda n: abs(med_a[n] - med_b[n]), reverse=True)[:rows]:
            x, y = med_a[name], med_b[name]
            lines.append(f"| `{name}` | {x * 1e3:.2f} | {y * 1e3:.2f} | {(x - y) * 1e3:+.2f} |")
        lines.append("")
    text = "\n".join(lines)
    if md_path:
        ids = {(r.get("stamp") or {}).get("series_id") for r in runs_a + runs_b}
        if len(ids) != 1 or None in ids:
            sys.exit("profile_host_overhead.py: all runs must carry the stamp of one series revision "
                     f"(got {sorted(map(str, ids))}): run them again")
        stamp = dict(a["stamp"], trees=list(dict.fromkeys(t for r in runs_a + runs_b for t in r["stamp"]["trees"])))
        stamp["command"] = (f"{run_command(a['variant'], a['tree'])} and {run_command(b['variant'], b['tree'])}, "
                            f"{len(runs_a)} and {len(runs_b)} runs, interleaved, then --compare (see its --help)")
        with open(md_path, "w") as md:
            md.write(stamps.stamp_markdown(text, stamp))
    print(text)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", choices=sorted(VARIANTS))
    parser.add_argument("--out")
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--seq", type=int, default=16)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--compare", nargs="+", metavar="JSON", help="runs of two variants (see above)")
    parser.add_argument("--md")
    parser.add_argument("--rows", type=int, default=12)
    args = parser.parse_args()
    if args.compare:
        compare(args.compare, args.md, args.rows)
    elif args.variant and args.out:
        run(args)
    else:
        parser.error("give --variant and --out, or --compare with the runs of two variants")


if __name__ == "__main__":
    main()
