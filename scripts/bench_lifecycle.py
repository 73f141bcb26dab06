#!/usr/bin/env python3
"""Memory, all-gather traffic and step time of ZeRO-3 + LoRA + activation checkpointing, on GPUs.

One variant per invocation; each runs on WORLD_SIZE GPUs (spawned here, NCCL) and writes one JSON
file. `--report` turns the JSON files into the Markdown table and PNG plot the RFC includes.

    PYTHONPATH=<deepspeed tree> python scripts/bench_lifecycle.py --variant series --out bench/series.json
    python scripts/bench_lifecycle.py --report bench/*.json \\
        --md docs/_generated/bench.md --png docs/_generated/bench.png

Variants: series (patched tree, non-reentrant checkpointing on every decoder layer), reentrant
(use_reentrant=True: the downstream workaround), no-ckpt (no checkpointing: the reference),
nonreentrant (non-reentrant on whatever tree PYTHONPATH names; on pristine v0.19.2 it crashes,
which is reported as such), and followup (non-reentrant on a release with its follow-up series,
e.g. v0.19.8 + patches/v0.19.8/, compared with nonreentrant on that pristine release). The model
is a random-init Llama (nothing downloaded) with PEFT LoRA on q/k/v/o, bf16, built under
deepspeed.zero.Init as Hugging Face does under ZeRO-3.

Step time on a noisy host: --pair runs two variants, each in one long-lived process at world size 1
on one device, taking turns in blocks of steps (ABBA, scripts/paired_blocks.py), and prints the
paired difference and ratio of their step times with a bootstrap interval, e.g. the workaround
against the series:

    python scripts/bench_lifecycle.py --pair workaround=reentrant@TREE-v0.19.2 series=series@TREE-series \
        --batch 4 --pairs 8 --block 3

--pair-report JSON... prints the figures of several such runs (their --out), each and pooled.
"""

import argparse
import json
import os
import re
import statistics
import sys
import time

# the all-gather counter is shared with the test scenarios
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "docs", "_ext"))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import stamps  # noqa: E402  (the series revision a run measured: docs/generated-inputs.md)

RUN_COMMAND = "on GPUs: tox -e bench (scripts/run-bench.sh), which ends with scripts/bench_lifecycle.py --report"

def tree_name(pythonpath):
    """The measured tree's name: the first entry of the run's PYTHONPATH (later ones hold
    requirements, e.g. a site directory on a GPU host), or "installed"."""
    return os.path.basename(pythonpath.split(os.pathsep)[0].rstrip("/")) or "installed"


def run_stamp(variant, deepspeed_version):
    """The stamp of one run: the series this checkout's patches/ holds (v0.19.8's follow-up for the
    followup variant, v0.19.2's for the others), which is what scripts/apply.sh built the trees from."""
    series = "v0.19.8" if variant == "followup" else "v0.19.2"
    tree = tree_name(os.environ.get("PYTHONPATH", ""))
    return stamps.make(stamps.Path(ROOT) / "patches" / series, deepspeed_version, [tree], RUN_COMMAND)


VARIANTS = {
    "series": "nonreentrant",
    "nonreentrant": "nonreentrant",
    "followup": "nonreentrant",
    # the two cheaper alternatives, on pristine v0.19.2: torch's recompute metadata check switched
    # off (what the CheckpointError's text suggests), and PR 8130's minimal coordinator skip
    # (emulated as tests/scenarios/bookkeeping.py does; the PR is not in any release)
    "nocheck": "nonreentrant",
    "minimal-skip": "nonreentrant",
    "reentrant": "reentrant",
    "no-ckpt": "none",
}
# the follow-up's all-gather target: frozen volume within 2% of the run without checkpointing
FOLLOWUP_VOLUME_TOLERANCE = 1.02


def bench_ds_config(batch, **zero_options):
    """The benchmark's DeepSpeed config: bf16, torch's AdamW, ZeRO-3 with DeepSpeed's defaults
    (plus ZERO_OPTIONS)."""
    return {
        "train_micro_batch_size_per_gpu": batch,
        "gradient_accumulation_steps": 1,
        "bf16": {
            "enabled": True
        },
        "optimizer": {
            "type": "AdamW",
            "params": {
                "lr": 1e-4,
                "torch_adam": True
            }
        },
        "zero_optimization": {
            "stage": 3,
            **zero_options
        },
    }


def build_model(args, ds_config, device=None):
    """The benchmark's model, built under deepspeed.zero.Init with DS_CONFIG, or, with DS_CONFIG None,
    in plain torch on DEVICE (the same model without DeepSpeed)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=32000,
                         hidden_size=args.hidden,
                         intermediate_size=int(args.hidden * 2.6875),
                         num_hidden_layers=args.layers,
                         num_attention_heads=args.hidden // 128,
                         num_key_value_heads=args.hidden // 128,
                         max_position_embeddings=args.seq,
                         torch_dtype=torch.bfloat16)
    if ds_config is None:
        with torch.device(device):
            model = LlamaForCausalLM(config).to(dtype=torch.bfloat16)
    else:
        import deepspeed
        with deepspeed.zero.Init(config_dict_or_path=ds_config, dtype=torch.bfloat16):
            model = LlamaForCausalLM(config)
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    # v0.19.2 cannot all-gather fp32 adapters on a bf16 base (a separate, later-fixed bug)
    model = get_peft_model(model, lora, autocast_adapter_dtype=False)
    for param in model.parameters():
        if param.requires_grad:
            param.data = param.data.to(torch.bfloat16)
    mode = VARIANTS[args.variant]
    if mode != "none":
        kwargs = {"use_reentrant": mode == "reentrant"}
        if args.variant == "nocheck":
            kwargs["determinism_check"] = "none"
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        if mode == "reentrant":
            # reentrant checkpointing needs an input that requires grad to produce any gradient
            model.enable_input_require_grads()
    return model


class CoordinatorProbe:
    """Where a step's parameter fetches wait, measured inside ZeRO-3's coordinator.

    Wraps PartitionedParameterCoordinator.fetch_sub_module and _invalidate_trace (class-wide, so
    it works on any DeepSpeed tree). Per fetch phase (forward, recompute: a forward inside a
    backward graph task, backward) it adds up the host seconds spent in the fetch and the bytes the
    fetch found NOT_AVAILABLE (gathered on demand, nothing overlapped) or INFLIGHT (prefetched, then
    waited for). A prefetch that works leaves the on-demand bytes near zero after the first step.
    """

    def __init__(self):
        import torch
        from deepspeed.runtime.zero.partitioned_param_coordinator import PartitionedParameterCoordinator as C
        self.totals = {}
        self.invalidations = 0
        fetch, invalidate = C.fetch_sub_module, C._invalidate_trace
        probe = self

        def timed_fetch(coordinator, module, forward):
            if not forward:
                phase = "backward"
            else:
                phase = "recompute" if torch._C._current_graph_task_id() != -1 else "forward"
            recurse = getattr(module, "ds_z3_leaf", False)
            for param in module.parameters(recurse=recurse):
                if hasattr(param, "ds_status"):
                    key = f"{phase}_{param.ds_status.name.lower()}_gib"
                    probe.add(key, param.ds_numel * param.ds_tensor.element_size() / 2**30)
            start = time.perf_counter()
            try:
                return fetch(coordinator, module, forward)
            finally:
                probe.add(f"{phase}_fetch_s", time.perf_counter() - start)

        def counted_invalidate(coordinator):
            probe.invalidations += 1
            return invalidate(coordinator)

        C.fetch_sub_module, C._invalidate_trace = timed_fetch, counted_invalidate

    def add(self, key, value):
        self.totals[key] = self.totals.get(key, 0.0) + value

    def take(self):
        """The totals since the last call, and the trace invalidations among them."""
        totals, self.totals = self.totals, {}
        totals["trace_invalidations"], self.invalidations = self.invalidations, 0
        return totals


def profile_step(engine, ids, accelerator):
    """One extra, untimed step under torch.profiler: the ops where host and device spend the step."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        accelerator.synchronize()
    averages = prof.key_averages()
    tables = {"self_cpu": averages.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60)}
    if torch.cuda.is_available():
        tables["self_device"] = averages.table(sort_by="self_cuda_time_total",
                                               row_limit=25,
                                               max_name_column_width=60)
    return tables


def build_engine(args):
    """The benchmark's engine: the model of build_model, bf16, ZeRO-3 with DeepSpeed's defaults."""
    import deepspeed
    import torch
    ds_config = bench_ds_config(args.batch)
    torch.manual_seed(0)
    model = build_model(args, ds_config)
    engine, *_ = deepspeed.initialize(model=model,
                                      model_parameters=[p for p in model.parameters() if p.requires_grad],
                                      config=ds_config)
    return engine


def init_distributed(rank):
    """Join the process group as RANK (the environment names the world) on the accelerator's device
    RANK; returns the accelerator."""
    import deepspeed
    from deepspeed.accelerator import get_accelerator
    from tests.harness.gloo import dealias_gloo_collectives, skip_shm_op_build
    accelerator = get_accelerator()
    accelerator.set_device(rank)
    backend = accelerator.communication_backend_name()
    if accelerator.device_name() == "cpu":
        skip_shm_op_build()  # the CPU smoke run never uses DeepSpeed's shm all-reduce op
    deepspeed.init_distributed(dist_backend=backend)
    if backend == "gloo":
        dealias_gloo_collectives()  # separate buffers for DeepSpeed's in-place collectives
    return accelerator


def run_rank(rank, args):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(args.world_size))
    import torch
    import deepspeed
    from tests.scenarios.zero3 import count_all_gathers
    accelerator = init_distributed(rank)
    probe = CoordinatorProbe()
    if args.variant == "minimal-skip":
        from tests.scenarios.bookkeeping import emulate_minimal_skip
        emulate_minimal_skip()
    engine = build_engine(args)
    engine.train()
    counts = count_all_gathers(engine.module)
    generator = torch.Generator().manual_seed(rank)
    ids = torch.randint(0, 32000, (args.batch, args.seq), generator=generator).to(accelerator.current_device_name())

    timeline = []  # memory after each decoder layer's forward and backward, during the last step
    record = [False]

    def sample(*_):
        # hooks return None: a value would replace the layer's output or the gradient
        if record[0]:
            timeline.append(accelerator.memory_allocated())

    def after_layer_forward(module, inputs, output):
        sample()
        hidden = output[0] if isinstance(output, tuple) else output
        if torch.is_grad_enabled() and hidden.requires_grad:
            hidden.register_hook(sample)  # fires as the layer's backward starts

    for layer in (m for m in engine.module.modules() if type(m).__name__ == "LlamaDecoderLayer"):
        layer.register_forward_hook(after_layer_forward)

    times, phases, probes, losses, peaks, backward_peaks, gathered = [], [], [], [], [], [], []
    for step in range(args.warmup + args.steps):
        record[0] = step == args.warmup + args.steps - 1
        before = dict(counts)
        probe.take()
        accelerator.synchronize()
        accelerator.reset_peak_memory_stats()
        start = time.perf_counter()
        loss = engine(input_ids=ids, labels=ids).loss
        accelerator.synchronize()
        forward_end = time.perf_counter()
        forward_peak = accelerator.max_memory_allocated()
        accelerator.reset_peak_memory_stats()
        engine.backward(loss)
        accelerator.synchronize()
        backward_end = time.perf_counter()
        backward_peak = accelerator.max_memory_allocated()
        engine.step()
        accelerator.synchronize()
        end = time.perf_counter()
        if step >= args.warmup:
            times.append(end - start)
            phases.append({
                "forward": forward_end - start,
                "backward": backward_end - forward_end,
                "optimizer": end - backward_end
            })
            probes.append(probe.take())
            peaks.append(max(forward_peak, backward_peak))
            backward_peaks.append(backward_peak)
            gathered.append({k: counts[k] - before[k] for k in counts})
        losses.append(loss.item())
    record[0] = False  # the timeline is the last timed step's, not the profiled step's
    profile = profile_step(engine, ids, accelerator) if args.profile else None
    result = {
        "stamp": run_stamp(args.variant, deepspeed.__version__.strip()),
        "variant": args.variant,
        "tree": os.environ.get("PYTHONPATH", ""),
        "deepspeed": deepspeed.__version__,
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name() if accelerator.device_name() == "cuda" else accelerator.device_name(),
        "world_size": args.world_size,
        "shape": {
            k: getattr(args, k)
            for k in ("layers", "hidden", "seq", "batch")
        },
        "step_s": {
            "median": statistics.median(times),
            "min": min(times),
            "max": max(times),
            "n": len(times),
            "all": times
        },
        "phase_s": {
            k: statistics.median(p[k] for p in phases)
            for k in phases[0]
        },
        "coordinator": {
            k: statistics.median(p.get(k, 0.0) for p in probes)
            for k in sorted(set().union(*probes))
        },
        "alloc_retries": accelerator.memory_stats().get("num_alloc_retries", 0),
        "peak_gib": max(peaks) / 2**30,
        "backward_peak_gib": max(backward_peaks) / 2**30,
        "allgather_gib_per_step": {
            k: statistics.median(g[k] for g in gathered) / 2**30
            for k in counts
        },
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "timeline_gib": [m / 2**30 for m in timeline],
        "profile": profile,
    }
    if rank == 0:
        with open(args.out, "w") as out:
            json.dump(result, out, indent=1)
        for name, table in (profile or {}).items():
            print(f"== {args.variant}: one profiled step, by {name} time\n{table}", flush=True)
    engine.destroy()
    # every rank leaves together: a rank that exits while a peer's process group still runs
    # can abort (std::terminate in the backend's threads)
    deepspeed.comm.barrier()
    deepspeed.comm.destroy_process_group()
    # the rank's work is done and written: leave without the interpreter's teardown, in which a
    # backend thread can still call std::terminate ("terminate called without an active
    # exception", seen on CPU runs now and then) and turn a finished run into a failed one
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def serve_variant(args):
    """The child of --pair: one engine of args.variant at world size 1 (the parent set RANK and
    WORLD_SIZE), warmed up, then serving blocks of steps (scripts/paired_blocks.py)."""
    import torch
    import deepspeed
    from paired_blocks import serve
    accelerator = init_distributed(0)
    engine = build_engine(args)
    engine.train()
    ids = torch.randint(0, 32000, (args.batch, args.seq), generator=torch.Generator().manual_seed(0))
    ids = ids.to(accelerator.current_device_name())
    losses = []

    def step():
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        return loss

    for _ in range(args.warmup):
        losses.append(step().item())
    serve(step, accelerator.synchronize, {
        "deepspeed": deepspeed.__file__,
        "version": deepspeed.__version__,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if accelerator.device_name() == "cuda" else "cpu",
        "warmup_losses": losses,
        "peak_gib": accelerator.max_memory_allocated() / 2**30,
    })


def run_pair(args):
    """--pair BASELINE OTHER: the two LABEL=VARIANT@TREE processes take turns (ABBA) in blocks of
    --block steps, --pairs times; prints the paired step-time difference and ratio."""
    from paired_blocks import BlockProcess, report, take_turns
    sides = []
    for spec in args.pair:
        label, _, rest = spec.partition("=")
        variant, _, tree = rest.partition("@")
        if not label or variant not in VARIANTS or not os.path.isdir(os.path.join(tree, "deepspeed")):
            sys.exit(f"bench_lifecycle: --pair {spec!r}: expected LABEL=VARIANT@TREE with a variant of "
                     f"{sorted(VARIANTS)} and a tree holding deepspeed/")
        sides.append((label, variant, tree))
    if args.pairs < 4 or args.block < 1:
        sys.exit("bench_lifecycle: --pairs must be at least 4 and --block at least 1")
    shape = ["--layers", str(args.layers), "--hidden", str(args.hidden), "--seq", str(args.seq), "--batch",
             str(args.batch), "--warmup", str(args.warmup)]
    processes = []
    try:
        for label, variant, tree in sides:
            processes.append(BlockProcess(label, tree, [os.path.abspath(__file__), "--serve-variant", variant, *shape]))
        for process, (label, variant, tree) in zip(processes, sides):
            ready = process.ready
            print(f"{label}: {variant} on {tree} (deepspeed {ready['version'].strip()}, torch {ready['torch']}, "
                  f"{ready['device']}); warm-up losses {[round(x, 5) for x in ready['warmup_losses']]}, "
                  f"peak {ready['peak_gib']:.3f} GiB", flush=True)
        blocks = take_turns(processes, args.pairs, args.block)
    finally:
        for process in processes:
            process.close()
    (baseline, *_), (other, *_) = sides
    title = (f"Llama {args.layers} x {args.hidden} + LoRA, batch {args.batch} x {args.seq}, world size 1; "
             f"{args.pairs} pairs of {args.block}-step blocks (ABBA) after {args.warmup} warm-up steps")
    for clock in ("wall_ms", "cpu_ms"):
        report(title, baseline, other, blocks, clock)
    if args.out:
        with open(args.out, "w") as out:
            versions = ", ".join(sorted({p.ready["version"].strip() for p in processes}))
            # as run_stamp: the follow-up's series when a side runs it, else v0.19.2's
            series = "v0.19.8" if any(variant == "followup" for _, variant, _ in sides) else "v0.19.2"
            stamp = stamps.make(stamps.Path(ROOT) / "patches" / series, versions,
                                [tree_name(tree) for _, _, tree in sides], "scripts/bench_lifecycle.py --pair")
            json.dump({"stamp": stamp, "sides": sides, "shape": shape, "block": args.block,
                       "ready": [p.ready for p in processes], "blocks": blocks}, out, indent=1)


def _pair_run_facts(run):
    """What must be the same in runs that --pair-report pools, by name, as it prints them."""
    facts = {"sides": ", ".join(f"{label}={variant}" for label, variant, *_ in run["sides"]),
             "series": run.get("stamp", {}).get("series_id", "unstamped")}
    facts.update(zip(run["shape"][::2], run["shape"][1::2]))
    if "block" in run:  # (runs written before the block size was stored lack it)
        facts["--block"] = str(run["block"])
    return facts


def report_pairs(paths):
    """--pair-report JSON...: the figures of each --pair run, then of all of them pooled.

    Runs of the same two sides on the same shape and series revision are pooled: each pair of blocks
    stays a pair, the runs' pairs are put together, and the figures are computed over all of them, so
    a run weighs as many pairs as it has. The runs may come from different calls on different hosts
    (the ratio of each pair is taken within its run, so a slower host does not bias it; the differences
    in ms mix the hosts' speeds). The bootstrap treats the pooled pairs as independent, which ignores
    what differs between calls: the per-run lines show how far the runs disagree.
    """
    from paired_blocks import report
    runs = []
    for path in paths:
        try:
            with open(path) as f:
                run = json.load(f)
            facts = _pair_run_facts(run)
            (baseline, *_), (other, *_) = run["sides"]
            blocks = run["blocks"]
            counts = (len(blocks[baseline]), len(blocks[other]))
            # what must not move between the two sides: the losses and the peak
            sides = "; ".join(f"{label} warm-up losses {[round(x, 5) for x in ready['warmup_losses']]}, peak "
                              f"{ready['peak_gib']:.3f} GiB" for (label, *_), ready in zip(run["sides"], run["ready"]))
        except (OSError, ValueError, KeyError, TypeError) as e:
            sys.exit(f"bench_lifecycle: --pair-report {path}: not the --out of a --pair run ({e!r})")
        if counts[0] != counts[1] or counts[0] < 2:
            sys.exit(f"bench_lifecycle: --pair-report {path}: {counts[0]} blocks of {baseline} and {counts[1]} of "
                     f"{other}; a run needs at least 2 pairs of blocks")
        if any(os.path.samefile(path, earlier) for earlier, *_ in runs):
            sys.exit(f"bench_lifecycle: --pair-report {path}: given twice")
        if runs:
            first_path, first = runs[0][0], runs[0][1]
            for name in sorted(set(facts) | set(first)):
                if name == "--block" and not (name in facts and name in first):
                    continue  # a run written before the block size was stored
                if facts.get(name) != first.get(name):
                    sys.exit(f"bench_lifecycle: --pair-report {path}: {name} {facts.get(name)} where {first_path} has "
                             f"{name} {first.get(name)}; only runs of the same sides, shape and series are pooled")
        runs.append((path, facts, blocks, sides))
    # every run has the first one's sides
    baseline, other = [side.split("=")[0] for side in runs[0][1]["sides"].split(", ")]
    facts = runs[0][1]
    title = (f"Llama {facts.get('--layers')} x {facts.get('--hidden')} + LoRA, batch {facts.get('--batch')} x "
             f"{facts.get('--seq')}, world size 1")
    for path, _, blocks, sides in runs:
        print(f"{path}: {len(blocks[baseline])} pairs; {sides}")
        report(f"  {title}", baseline, other, blocks, "wall_ms")
    if len(runs) > 1:
        pooled = {label: [block for _, _, blocks, _ in runs for block in blocks[label]] for label in (baseline, other)}
        report(f"{title}; {len(runs)} runs pooled", baseline, other, pooled, "wall_ms")


def run_variant(args):
    import torch.multiprocessing as mp
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29600 + os.getpid() % 1000))
    try:
        mp.spawn(run_rank, args=(args, ), nprocs=args.world_size, join=True)
    except Exception as error:  # a crash (pristine non-reentrant) is a result too
        summary = exception_summary(str(error))
        with open(args.out, "w") as out:
            failure = {"stamp": run_stamp(args.variant, "see tree"), "variant": args.variant,
                       "tree": os.environ.get("PYTHONPATH", ""), "error": summary}
            json.dump(failure, out, indent=1)
        print(f"{args.variant}: failed: {summary}", file=sys.stderr)


def exception_summary(text, limit=300):
    """The exception line of a rank's traceback ("CheckpointError: ..."), not its last line of text:
    torch's CheckpointError message ends with several lines of advice."""
    lines = text.strip().splitlines()
    for i, line in enumerate(lines):
        if re.match(r"^[\w.]+(Error|Exception): ", line):
            message = " ".join(part.strip() for part in lines[i:i + 3])
            return message[:limit]
    return (lines[-1] if lines else "unknown error")[:limit]


def short_error(message, words=6):
    """A failure as the table shows it: the exception's class and the start of its reason. The
    whole message goes into a numbered note under the table, so that the figures' columns of the
    other rows are not pushed off screen by a 300-character cell."""
    match = re.match(r"^([\w.]+)(?::\s*(.*))?$", message.strip(), re.S)
    if not match:
        return message[:60]
    name, reason = match.group(1).rsplit(".", 1)[-1], (match.group(2) or "")
    reason = re.sub(r"^[\w.]+:\s*", "", reason)  # "torch.utils.checkpoint: Recomputed ..."
    head = reason.split()
    return name + (": " + " ".join(head[:words]) + (" …" if len(head) > words else "") if head else "")


def group_runs(results):
    """Runs of one variant on one tree form a group, in the order the groups first ran."""
    groups = {}
    for r in results:
        tree = tree_name(r.get("tree", ""))
        groups.setdefault((r["variant"], tree), []).append(r)
    return groups


def summarize(runs):
    """One group's figures: step time over all runs' steps, memory at its worst, the rest from run 1."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return None
    steps = [t for r in ok for t in r["step_s"]["all"]]
    return {
        "runs": len(ok),
        "run_medians": [r["step_s"]["median"] for r in ok],
        "median": statistics.median(steps),
        "min": min(steps),
        "max": max(steps),
        "peak_gib": max(r["peak_gib"] for r in ok),
        "backward_peak_gib": max(r["backward_peak_gib"] for r in ok),
        "gather": ok[0]["allgather_gib_per_step"],
        "phase_s": {k: statistics.median(r["phase_s"][k] for r in ok)
                    for k in ok[0]["phase_s"]},
        "coordinator": ok[0]["coordinator"],
        "alloc_retries": max(r["alloc_retries"] for r in ok),
        "loss": (ok[0]["loss_first"], ok[0]["loss_last"]),
        "first": ok[0],
        # a profiled run's timeline may hold the profiled step too (before the script stopped
        # recording there): plot an unprofiled run where there is one
        "timeline": next((r for r in ok if not r.get("profile")), ok[0])["timeline_gib"],
    }


# A verdict needs at least this many runs of each group it compares: fewer cannot show a spread.
MIN_RUNS_FOR_VERDICT = 3
NOT_JUDGED = "not judged (<3 runs or overlapping ranges)"


def verdict(ok, *groups, step_time=False):
    """**met** or **missed**, or NOT_JUDGED when a compared group has fewer than MIN_RUNS_FOR_VERDICT
    runs or, for step time, when the groups' [min, max] ranges overlap (the difference is inside the
    noise)."""
    if any(g["runs"] < MIN_RUNS_FOR_VERDICT for g in groups):
        return NOT_JUDGED
    if step_time and any(a["min"] <= b["max"] and b["min"] <= a["max"]
                         for i, a in enumerate(groups) for b in groups[i + 1:]):
        return NOT_JUDGED
    return "**met**" if ok else "**missed**"


def targets(summaries):
    """Issue 6's targets for the series and the follow-up's, each judged from the measured figures
    where the runs allow a verdict; an empty list when neither series ran."""
    series = summaries.get("series")
    if series is None:
        return followup_targets(summaries)
    lines = []

    def total(s):
        return s["gather"]["frozen"] + s["gather"]["trainable"]

    reference = summaries.get("no-ckpt")
    if reference:
        met = total(series) <= total(reference)
        lines.append(f"- All-gather volume per step ≤ the run without checkpointing: "
                     f"{verdict(met, series, reference)} ({total(series):.3f} vs {total(reference):.3f} GiB).")
    bounds = {k: summaries[k] for k in ("reentrant", "upstream") if summaries.get(k)}
    if bounds:
        named = ", ".join(f"{k} {v['peak_gib']:.2f} GiB" for k, v in bounds.items())
        met = series["peak_gib"] <= min(v["peak_gib"] for v in bounds.values())
        lines.append(f"- Peak memory ≤ min({', '.join(bounds)}): {verdict(met, series, *bounds.values())} "
                     f"({series['peak_gib']:.2f} GiB; {named}).")
    if summaries.get("reentrant"):
        reentrant = summaries["reentrant"]
        met = series["median"] <= reentrant["median"]
        lines.append(f"- Median step time ≤ the reentrant workaround's: "
                     f"{verdict(met, series, reentrant, step_time=True)} "
                     f"({series['median']:.3f} vs {reentrant['median']:.3f} s, "
                     f"ratio {series['median'] / reentrant['median']:.2f}).")
    return lines + followup_targets(summaries)


def followup_targets(summaries):
    """The follow-up series' targets against the pristine release it applies to (issue 14)."""
    followup = summaries.get("followup")
    if followup is None:
        return []
    lines = []
    reference = summaries.get("no-ckpt")
    if reference:
        frozen, floor = followup["gather"]["frozen"], reference["gather"]["frozen"]
        ratio = frozen / floor
        lines.append(f"- Follow-up: frozen all-gather volume per step ≤ {FOLLOWUP_VOLUME_TOLERANCE}× the run without "
                     f"checkpointing: {verdict(ratio <= FOLLOWUP_VOLUME_TOLERANCE, followup, reference)} "
                     f"({frozen:.3f} vs {floor:.3f} GiB, {ratio:.3f}×).")
    upstream = summaries.get("upstream")
    if upstream:
        step = verdict(followup["median"] <= upstream["median"], followup, upstream, step_time=True)
        lines.append(f"- Follow-up vs its pristine release: frozen all-gather {followup['gather']['frozen']:.3f} vs "
                     f"{upstream['gather']['frozen']:.3f} GiB; peak {followup['peak_gib']:.2f} vs "
                     f"{upstream['peak_gib']:.2f} GiB (≤: {verdict(followup['peak_gib'] <= upstream['peak_gib'], followup, upstream)}); "
                     f"median step {followup['median']:.3f} vs {upstream['median']:.3f} s "
                     f"(≤: {step}).")
    return lines


def report_stamp(results):
    """The report's stamp, from its runs': they must all have measured one revision of the series."""
    runs = [r["stamp"] for r in results if "stamp" in r]
    if len(runs) != len(results):
        sys.exit("bench_lifecycle.py: some runs carry no stamp (made before stamps existed): stamp them with "
                 "scripts/stamp-generated.py --patches-at COMMIT:DIR, COMMIT being the revision they measured")
    # a follow-up report is about the follow-up series; its no-checkpointing floor runs on v0.19.2
    primary = "v0.19.8" if any(r.get("variant") == "followup" for r in results) else "v0.19.2"
    ids = {(r["series"], r["series_id"]) for r in runs if r["series"] == primary} or {
        (r["series"], r["series_id"]) for r in runs}
    if len(ids) != 1:
        sys.exit(f"bench_lifecycle.py: the runs measured different series revisions {sorted(ids)}: report them apart")
    series, series_id = ids.pop()
    first = next(r for r in runs if (r["series"], r["series_id"]) == (series, series_id))
    trees = []
    for r in results:
        name = tree_name(r.get("tree", ""))
        if name not in trees:
            trees.append(name)
    versions = sorted({r["deepspeed"].strip() for r in results if "deepspeed" in r})
    return dict(first, trees=trees, deepspeed=", ".join(versions), command=RUN_COMMAND)


def report(paths, md_path, png_path, caption=None):
    results = [json.load(open(p)) for p in paths]
    groups = group_runs(results)
    lines = [
        "| variant | tree | runs | median step (s) [min, max] | run medians (s) | peak alloc (GiB) | "
        "backward peak (GiB) | all-gather/step frozen (GiB) | trainable (GiB) | loss first → last |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    summaries = {}  # for the targets: series, reentrant, no-ckpt, and upstream (non-reentrant that ran)
    timing = [
        "| variant | tree | forward (s) | backward (s) | optimizer (s) | fetch wait fwd / recompute / bwd (s) | "
        "gathered on demand fwd / recompute / bwd (GiB) | trace invalidations | allocator retries |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []  # full failure messages, numbered
    for (variant, tree), runs in groups.items():
        s = summarize(runs)
        if s is None:
            notes.append(f"{variant} on {tree}: `{runs[0]['error']}`")
            lines.append(f"| {variant} | {tree} | {len(runs)} | failed: {short_error(runs[0]['error'])} "
                         f"(note {len(notes)}) | | | | | | |")
            continue
        summaries["upstream" if variant == "nonreentrant" else variant] = s
        version = s["first"]["deepspeed"].strip()
        s["label"] = {
            "nonreentrant": f"{variant} (DeepSpeed {version})",
            "followup": f"{variant} (DeepSpeed {version} + follow-up)"
        }.get(variant, variant)
        medians = ", ".join(f"{m:.3f}" for m in s["run_medians"])
        lines.append(f"| {variant} | {tree} | {s['runs']} | {s['median']:.3f} [{s['min']:.3f}, {s['max']:.3f}] | "
                     f"{medians} | {s['peak_gib']:.2f} | {s['backward_peak_gib']:.2f} | "
                     f"{s['gather']['frozen']:.3f} | {s['gather']['trainable']:.3f} | "
                     f"{s['loss'][0]:.3f} → {s['loss'][1]:.3f} |")
        c, p = s["coordinator"], s["phase_s"]
        waits = " / ".join(f"{c.get(f'{ph}_fetch_s', 0.0):.3f}" for ph in ("forward", "recompute", "backward"))
        demand = " / ".join(f"{c.get(f'{ph}_not_available_gib', 0.0):.3f}"
                            for ph in ("forward", "recompute", "backward"))
        timing.append(f"| {variant} | {tree} | {p['forward']:.3f} | {p['backward']:.3f} | {p['optimizer']:.3f} | "
                      f"{waits} | {demand} | {c.get('trace_invalidations', 0):.0f} | {s['alloc_retries']} |")
    ok = [s["first"] for s in summaries.values()]
    stamp = report_stamp(results)
    if notes:
        lines += [""] + [f"{i}. {note}" for i, note in enumerate(notes, 1)]
    if ok:
        r = ok[0]
        trees = {}
        for run in results:
            name = tree_name(run.get("tree", ""))
            if "deepspeed" not in run:
                continue
            text = f"DeepSpeed {run['deepspeed'].strip()}"
            if run["variant"] in ("series", "followup"):  # the tree apply.sh patched with the series
                text += (f" + patches/{run['stamp']['series']} at series id {run['stamp']['series_id']} "
                         f"({run['stamp']['patches']} patches)")
            trees.setdefault(name, text)
        lines += [
            "",
            f"Trees: {'; '.join(f'{name} = {text}' for name, text in trees.items())}.",
            "",
            f"{r['gpu']} × {r['world_size']}, torch {r['torch']}; Llama "
            f"{r['shape']['layers']} layers, hidden {r['shape']['hidden']}, sequence {r['shape']['seq']}, "
            f"{r['shape']['batch']} per GPU, LoRA r=16 on q/k/v/o, bf16, ZeRO-3 defaults; step time over "
            f"{r['step_s']['n']} steps after warm-up in each run, runs as separate processes; all-gather "
            f"bytes counted at the parameters' gather calls; memory from the allocator on rank 0.",
            "",
            "Where the time goes (medians per step; fetch wait is host time inside ZeRO-3's "
            "`fetch_sub_module`; on demand means the fetch found the parameter not prefetched):",
            "",
        ] + timing
        verdicts = targets(summaries)
        if verdicts:
            lines += ["", "Targets:", ""] + verdicts
    if caption:  # a captioned table (MyST's table directive), so the page names what it shows
        end = lines.index("")
        lines[:end] = [f":::{{table}} {caption}"] + lines[:end] + [":::"]
    with open(md_path, "w") as md:
        md.write(stamps.stamp_markdown("\n".join(lines) + "\n", stamp))
    if png_path and ok:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(8, 5.5))
        # several variants draw the same curve: a marker and a dash pattern of its own tell each
        # one apart where the lines lie on top of each other
        styles = [("o", "-"), ("s", "--"), ("^", "-."), ("v", ":"), ("D", (0, (5, 1))), ("x", (0, (3, 1, 1, 1))),
                  ("P", (0, (1, 2))), ("*", (0, (8, 2)))]
        for index, s in enumerate(summaries.values()):
            # reentrant checkpointing runs the layers' forward hooks again in backward: scale each
            # timeline to the step so that forward and backward line up across variants
            n = max(len(s["timeline"]) - 1, 1)
            marker, dashes = styles[index % len(styles)]
            # markers of each variant at points of their own, so that identical curves show them all
            every = max(n // 8, 1)
            line, = ax.plot([i / n for i in range(len(s["timeline"]))], s["timeline"], marker=marker,
                            markersize=6, markevery=(index % every, every), linestyle=dashes, linewidth=1.6,
                            label=f"{s['label']}: peak {s['peak_gib']:.2f} GiB")
            # The timeline is sampled only at decoder-layer boundaries; the peak inside a layer (the
            # table's peak alloc) is higher. Draw that peak too, so the plot does not understate it.
            ax.axhline(s["peak_gib"], color=line.get_color(), linestyle="-", linewidth=0.8, alpha=0.5)
        ax.set_xlabel("progress through one step: decoder-layer forward ends, then backward starts (scaled)")
        ax.set_ylabel("allocated GiB (rank 0)")
        ax.set_title("marked lines: allocated at decoder-layer boundaries; thin horizontal lines: the allocator's "
                     "peak in the step",
                     fontsize=9)
        # below the axes, in two columns: inside them it covered the curves, and at 8 pt it was
        # about 3 px tall where a phone scales the figure to its width
        ax.legend(fontsize=11, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
        fig.tight_layout()
        fig.savefig(png_path, dpi=120, metadata={stamps.KEY: json.dumps(stamp)})


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", choices=sorted(VARIANTS))
    parser.add_argument("--out")
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--profile", action="store_true", help="profile one extra step and keep the op tables")
    parser.add_argument("--report", nargs="+", metavar="JSON")
    parser.add_argument("--md")
    parser.add_argument("--png")
    parser.add_argument("--caption", help="caption of the report's main table")
    parser.add_argument("--pair", nargs=2, metavar="LABEL=VARIANT@TREE",
                        help="instead of one variant: two (the baseline first) in long-lived processes at world "
                        "size 1 taking turns in blocks of steps, and their paired step-time difference")
    parser.add_argument("--pairs", type=int, default=10, help="with --pair: pairs of blocks (default 10)")
    parser.add_argument("--block", type=int, default=3, help="with --pair: steps per block (default 3)")
    parser.add_argument("--pair-report", nargs="+", metavar="JSON",
                        help="print the figures of --pair runs (their --out), each and pooled")
    parser.add_argument("--serve-variant", choices=sorted(VARIANTS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_variant:
        args.variant = args.serve_variant
        serve_variant(args)
    elif args.pair and args.pair_report:
        parser.error("give --pair or --pair-report, not both")
    elif args.pair:
        run_pair(args)
    elif args.pair_report:
        report_pairs(args.pair_report)
    elif args.report:
        if not args.md:
            parser.error("--report needs --md")
        report(args.report, args.md, args.png, args.caption)
    elif args.variant and args.out:
        run_variant(args)
    else:
        parser.error("give --variant and --out, or --report")


if __name__ == "__main__":
    main()
