#!/usr/bin/env python3
"""Where the time of one training step goes, on one GPU: torch alone vs ZeRO-3.

The model is scripts/bench_lifecycle.py's (a random-init Llama with PEFT LoRA r=16 on q/k/v/o,
bf16; under ZeRO-3 built inside deepspeed.zero.Init with DeepSpeed's defaults and a torch AdamW),
at world size 1. One variant per invocation, one JSON file per variant; `--report` makes the
Markdown table. Variants:

    torch-reentrant      no DeepSpeed: the model on the GPU, torch.optim.AdamW on the LoRA params,
                         torch.utils.checkpoint with use_reentrant=True
    torch-nonreentrant   the same with use_reentrant=False
    ds-reentrant         ZeRO-3 (the tree PYTHONPATH names), use_reentrant=True
    ds-nonreentrant      ZeRO-3 (the tree PYTHONPATH names), use_reentrant=False

Each run: --warmup steps, then --steps timed steps (host clock, one device synchronize at the
end of each step), then three instrumented passes of --profile-steps steps each:

 1. torch.profiler, CPU + CUDA activities, no Python stacks (light): GPU busy time per step (the
    union of kernel, memcpy and memset intervals inside the step's window), kernel time, the top
    kernels, and host time blocked in cuda*Synchronize.
 2. torch.profiler with with_stack=True: its Python tracer records every Python and C function
    call of every thread that runs Python (the main thread, and the autograd engine's device
    thread, where backward hooks, checkpoint unpacking and recomputation run on a GPU). From the
    event tree: own (self) wall time per function, summed into categories by file, and the
    inclusive time under ZeRO-3's files (the time between entering their outermost frame and
    leaving it, whatever ran inside). The main thread's wait inside the autograd engine
    (run_backward) is not counted as host work; the autograd thread's events are.
 3. cProfile with a wall-clock timer: own time per function and per category, call counts. On
    Python 3.12 cProfile is built on sys.monitoring and sees every thread: the autograd thread's
    calls nest under the main thread's run_backward, which waits for them with the GIL released.

The report's host categories come from cProfile. Seen on an H100 (torch 2.11.0+cu130, Python
3.12.3): the stack profile's Python tracer recorded the main thread's calls completely but the
autograd thread's in only one of the two profiled steps (call counts half of cProfile's for
unpack_hook, check_recomputed_tensors_match, the recompute's pack_hook, the backward fetches), so
its backward-side figures (ZeRO-3 inclusive time, checkpoint own time, per-file own time) are
lower bounds; its main-thread (forward) figures agree with cProfile's. thread_categories_ms in
the JSON shows the split per thread. The instrumented steps run slower than the timed ones (about
2.5x for ZeRO-3 under cProfile or the tracer, 1.25x under the light profile): each pass's
per-step wall time is reported, so that the inflation shows.

    PYTHONPATH=build/trace/ds-v0192-series python scripts/trace_step.py --variant ds-nonreentrant \\
        --label 4-v0192-series --out build/trace-out/trace_4-v0192-series.json
    python scripts/trace_step.py --report build/trace-out/trace_*.json --md build/trace-out/table.md

scripts/run-trace.sh runs six variants (torch alone and four DeepSpeed trees) on a GPU host.
"""

import argparse
import collections
import cProfile
import gc
import json
import os
import pstats
import re
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from bench_lifecycle import bench_ds_config, build_model as bench_model  # noqa: E402  (the benchmark's model)

VARIANTS = {
    "torch-reentrant": ("torch", True),
    "torch-nonreentrant": ("torch", False),
    "ds-reentrant": ("ds", True),
    "ds-nonreentrant": ("ds", False),
}
ZERO3_FILES = ("parameter_offload.py", "partitioned_param_coordinator.py", "partition_parameters.py", "stage3.py")
CATEGORIES = (
    "zero3_py",  # own time of Python functions in ZeRO-3's four files
    "ds_other_py",  # other DeepSpeed Python (engine, comm, utils, ...)
    "checkpoint_py",  # torch/utils/checkpoint.py
    "model_py",  # transformers, peft
    "torch_py",  # other torch Python (nn.Module call, autograd, optim, ...)
    "other_py",  # anything else in Python (stdlib, this script)
    "builtin",  # own time of C functions called from Python, outside torch ops
    "torch_op",  # own time of torch ops (dispatcher, C++ op code, kernel launches)
    "other_cpp",  # other recorded C++ events
)


# ---------------------------------------------------------------------------------------------
# The model and the step: the benchmark's (scripts/bench_lifecycle.py)


def build_model(args, ds_config, reentrant, device):
    import torch
    torch.manual_seed(0)
    return bench_model(argparse.Namespace(hidden=args.hidden, layers=args.layers, seq=args.seq,
                                          variant="reentrant" if reentrant else "series"), ds_config, device)


class Trainer:
    """forward(), backward(loss), step() for either a DeepSpeed engine or plain torch."""

    def __init__(self, args, mode, reentrant, device):
        import torch
        self.mode = mode
        if mode == "ds":
            import deepspeed
            config = bench_ds_config(args.batch)
            model = build_model(args, config, reentrant, device)
            self.engine, *_ = deepspeed.initialize(model=model,
                                                   model_parameters=[p for p in model.parameters() if p.requires_grad],
                                                   config=config)
            self.engine.train()
        else:
            self.model = build_model(args, None, reentrant, device)
            self.model.train()
            self.optimizer = torch.optim.AdamW([p for p in self.model.parameters() if p.requires_grad], lr=1e-4)

    def forward(self, ids):
        module = self.engine if self.mode == "ds" else self.model
        return module(input_ids=ids, labels=ids).loss

    def backward(self, loss):
        if self.mode == "ds":
            self.engine.backward(loss)
        else:
            loss.backward()

    def step(self):
        if self.mode == "ds":
            self.engine.step()
        else:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)


# ---------------------------------------------------------------------------------------------
# Attribution of host time: the torch.profiler event tree (with_stack=True)

PY_NAME = re.compile(r"^(.*)\((\d+)\): (.*)$")


def short_path(path):
    """A file's path from its package down (deepspeed/..., torch/..., transformers/...)."""
    # an installed package: from site-packages down (the interpreter's own directory can hold a
    # package's name, as /opt/torch/.venv on the GPU hosts does)
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            return path.rsplit(marker, 1)[1]
    # a tree on PYTHONPATH (build/trace/ds-*/deepspeed/...)
    match = re.search(r"(?:^|/)((?:deepspeed|torch|transformers|peft|accelerate|op_builder)/.*)$", path)
    if match:
        return match.group(1)
    match = re.search(r"/lib/python\d+\.\d+/(.*)$", path)
    if match:
        return "stdlib/" + match.group(1)
    return "/".join(path.split("/")[-2:])


def py_category(path):
    path = short_path(path)
    if path.startswith("deepspeed/runtime/zero/") and path.rsplit("/", 1)[-1] in ZERO3_FILES:
        return "zero3_py"
    if path.startswith("deepspeed/") or path.startswith("op_builder/"):
        return "ds_other_py"
    if path == "torch/utils/checkpoint.py":
        return "checkpoint_py"
    if path.startswith(("transformers/", "peft/", "accelerate/")):
        return "model_py"
    if path.startswith("torch/"):
        return "torch_py"
    return "other_py"


def function_key(name):
    """'short/path.py(line): function' for a Python frame; the name itself otherwise."""
    match = PY_NAME.match(name)
    if not match:
        return re.sub(r" at 0x[0-9a-f]+", "", name)
    return f"{short_path(match.group(1))}({match.group(2)}): {match.group(3)}"


def attribute(tree, window_name, steps):
    """Per-step own wall time by category and by function, from torch.profiler's event tree.

    window_name: the function (a PyCall event on the main thread) whose call spans the profiled
    steps; its interval is the window. Events of other threads count where they overlap it.
    """
    from torch._C._profiler import _EventType
    PyCall, PyCCall, TorchOp = _EventType.PyCall, _EventType.PyCCall, _EventType.TorchOp

    def interval(e):
        return e.start_time_ns, e.end_time_ns

    # find the window on the main thread
    window, main_tid, window_root = None, None, None
    for root in tree:
        stack = [root]
        while stack and window is None:
            e = stack.pop()
            if e.tag == PyCall and e.name.endswith(": " + window_name):
                window, main_tid, window_root = e, e.start_tid, root
                break
            stack.extend(e.children)
        if window is not None:
            break
    if window is None:
        raise RuntimeError(f"no {window_name} frame in the profile")
    w0, w1 = interval(window)

    cats = collections.Counter()
    per_file = collections.Counter()  # ZeRO-3 and other DeepSpeed own time per file
    functions = collections.Counter()  # own time per Python function (and C function)
    calls = collections.Counter()
    inclusive = collections.Counter()  # zero3 / checkpoint: outermost frames' clipped duration
    threads = collections.Counter()  # per thread: accounted host time
    thread_cats = collections.defaultdict(collections.Counter)
    bwd_wait = 0
    n_events = 0

    def clip(a, b):
        return max(0, min(b, w1) - max(a, w0))

    # the window, and every other root that overlaps it (other threads' roots; on the main thread,
    # roots beside the window's own root, which only a tree built across threads would give);
    # device-side activity (kernels on a stream) is not host time
    host = (PyCall, PyCCall, TorchOp)
    overlapping = [r for r in tree if r is not window_root and r.end_time_ns > w0 and r.start_time_ns < w1]
    roots = [window] + [r for r in overlapping if r.tag in host]
    skipped_roots = collections.Counter(str(r.tag) for r in overlapping if r.tag not in host)
    main_extra = sum(min(r.end_time_ns, w1) - max(r.start_time_ns, w0)
                     for r in overlapping if r.tag in host and r.start_tid == main_tid)
    # (event, ancestors' inclusive categories, parent interval)
    stack = [(r, frozenset(), (w0, w1)) for r in roots]
    while stack:
        e, inside, (p0, p1) = stack.pop()
        n_events += 1
        a, b = interval(e)
        a, b = max(a, p0), min(b, p1)  # an event recorded past its parent (record_function) is clipped
        if b <= a or b <= w0 or a >= w1:
            continue
        own = clip(a, b)
        for c in e.children:
            c0, c1 = interval(c)
            own -= max(0, min(b, c1, w1) - max(a, c0, w0))
        own = max(own, 0)
        name = e.name
        if e.tag == PyCall:
            match = PY_NAME.match(name)
            cat = py_category(match.group(1)) if match else "other_py"
        elif e.tag == PyCCall:
            cat = "bwd_wait" if "run_backward" in name and e.start_tid == main_tid else "builtin"
        elif e.tag == TorchOp:
            cat = "torch_op"
        else:
            cat = "other_cpp"
        if e is window:
            cat = "other_py"
        if cat == "bwd_wait":
            bwd_wait += own
        else:
            cats[cat] += own
            threads[e.start_tid] += own
            thread_cats[e.start_tid][cat] += own
        if e.tag in (PyCall, PyCCall):
            key = function_key(name)
            functions[key] += own
            calls[key] += 1
            if cat in ("zero3_py", "ds_other_py"):
                per_file[short_path(PY_NAME.match(name).group(1))] += own
        new_inside = inside
        for incl in ("zero3_py", "checkpoint_py"):
            if cat == incl and incl not in inside:
                inclusive[incl] += clip(a, b)
                new_inside = new_inside | {incl}
        for c in e.children:
            stack.append((c, new_inside, (a, b)))

    wall = (w1 - w0)
    ms = lambda ns: ns / 1e6 / steps  # noqa: E731
    accounted = sum(cats.values())
    return {
        "wall_ms": ms(wall),
        "categories_ms": {c: ms(cats.get(c, 0)) for c in CATEGORIES},
        "accounted_ms": ms(accounted),
        # main-thread time inside the autograd engine that no thread's recorded event covers: the
        # engine's own work between nodes, and waiting
        "untraced_ms": ms(wall - accounted),
        "main_bwd_wait_ms": ms(bwd_wait),
        "inclusive_ms": {k: ms(v) for k, v in inclusive.items()},
        "per_file_ms": {k: ms(v) for k, v in per_file.most_common()},
        "threads_ms": {str(k): ms(v) for k, v in threads.most_common()},
        "main_tid": main_tid,
        "skipped_roots": dict(skipped_roots),
        "main_thread_extra_roots_ms": ms(main_extra),
        "thread_categories_ms": {str(t): {k: ms(v) for k, v in c.most_common()} for t, c in thread_cats.items()},
        "events": n_events,
        "top_functions": [[k, ms(v), calls[k] / steps] for k, v in functions.most_common(60)],
        "top_ds_functions": [[k, ms(v), calls[k] / steps]
                             for k, v in functions.most_common() if k.startswith(("deepspeed/", "op_builder/"))][:40],
    }


# ---------------------------------------------------------------------------------------------
# GPU busy and idle: the light profile's chrome trace


def union_length(intervals):
    total, end = 0.0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def gpu_summary(trace_path, steps):
    with open(trace_path) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    windows = {}
    phases = collections.defaultdict(list)
    gpu, syncs = [], []
    for e in events:
        if e.get("ph") != "X":
            continue
        cat, name = e.get("cat", ""), e.get("name", "")
        start, dur = float(e.get("ts", 0)), float(e.get("dur", 0))
        if cat == "user_annotation" and name.startswith("trace_step_"):
            windows[name] = (start, start + dur)
        elif cat == "user_annotation" and name.startswith("trace_phase_"):
            phases[name[len("trace_phase_"):]].append(dur)
        elif cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            gpu.append((start, start + dur, cat, name))
        elif cat == "cuda_runtime" and "Synchronize" in name:
            syncs.append((start, start + dur, name))
    result = {"steps": [], "top_kernels_ms": {}, "phase_host_ms": {k: sum(v) / 1e3 / len(v) for k, v in phases.items()}}
    kernel_names = collections.Counter()
    for step in sorted(windows):
        w0, w1 = windows[step]
        inside = [(max(a, w0), min(b, w1), c, n) for a, b, c, n in gpu if b > w0 and a < w1]
        busy = union_length([(a, b) for a, b, _, _ in inside])
        by_cat = collections.Counter()
        for a, b, c, n in inside:
            key = "nccl" if c == "kernel" and "nccl" in n.lower() else c
            by_cat[key] += b - a
            kernel_names[n[:100]] += b - a
        sync = sum(min(b, w1) - max(a, w0) for a, b, _ in syncs if b > w0 and a < w1)
        result["steps"].append({
            "wall_ms": (w1 - w0) / 1e3,
            "gpu_busy_ms": busy / 1e3,
            "gpu_idle_ms": (w1 - w0 - busy) / 1e3,
            "by_kind_ms": {k: v / 1e3 for k, v in by_cat.items()},
            "host_sync_wait_ms": sync / 1e3,
            "gpu_ops": len(inside),
        })
    n = max(len(result["steps"]), 1)
    result["top_kernels_ms"] = {k: v / 1e3 / n for k, v in kernel_names.most_common(15)}
    for key in ("wall_ms", "gpu_busy_ms", "gpu_idle_ms", "host_sync_wait_ms", "gpu_ops"):
        values = [s[key] for s in result["steps"]]
        result[key] = statistics.mean(values) if values else None
    kinds = set().union(*(s["by_kind_ms"] for s in result["steps"])) if result["steps"] else set()
    result["by_kind_ms"] = {k: statistics.mean(s["by_kind_ms"].get(k, 0.0) for s in result["steps"]) for k in kinds}
    return result


# ---------------------------------------------------------------------------------------------
# One variant


def run(args):
    mode, reentrant = VARIANTS[args.variant]
    import torch
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    on_gpu = device == "cuda"
    if mode == "ds":
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29800 + os.getpid() % 150))
        if not on_gpu:
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        import deepspeed
        from deepspeed.accelerator import get_accelerator
        if on_gpu:
            get_accelerator().set_device(0)
            deepspeed.init_distributed(dist_backend="nccl")
        else:
            sys.path.insert(0, ROOT)
            from tests.harness.gloo import dealias_gloo_collectives, skip_shm_op_build
            skip_shm_op_build()
            deepspeed.init_distributed(dist_backend="gloo")
            dealias_gloo_collectives()
        ds_version = deepspeed.__version__.strip()
        ds_path = os.path.dirname(deepspeed.__file__)
    else:
        ds_version, ds_path = None, None
        assert "deepspeed" not in sys.modules
    if on_gpu:
        torch.cuda.set_device(0)
    else:
        torch.set_num_threads(args.threads)

    def sync():
        if on_gpu:
            torch.cuda.synchronize()

    trainer = Trainer(args, mode, reentrant, device)
    ids = torch.randint(0, 32000, (args.batch, args.seq), generator=torch.Generator().manual_seed(0)).to(device)
    losses = []

    def one_step(tag=None):
        from torch.profiler import record_function
        if tag is None:
            loss = trainer.forward(ids)
            trainer.backward(loss)
            trainer.step()
        else:
            with record_function("trace_phase_forward"):
                loss = trainer.forward(ids)
            with record_function("trace_phase_backward"):
                trainer.backward(loss)
            with record_function("trace_phase_optimizer"):
                trainer.step()
        losses.append(loss.detach())
        sync()

    def _profiled_steps(n, tag=None):
        from torch.profiler import record_function
        sync()
        start = time.perf_counter()
        for i in range(n):
            if tag:
                with record_function(f"trace_step_{i}"):
                    one_step(tag)
            else:
                one_step()
        return (time.perf_counter() - start) * 1e3 / n

    log = lambda *a: print(f"[{args.label}]", *a, flush=True)  # noqa: E731
    t_start = time.perf_counter()
    for _ in range(args.warmup):
        one_step()
    log(f"warm-up done in {time.perf_counter() - t_start:.1f} s")
    if on_gpu:
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(args.steps):
        sync()
        start = time.perf_counter()
        one_step()
        times.append(time.perf_counter() - start)
    log("step times (s):", " ".join(f"{t:.3f}" for t in times))
    peak = torch.cuda.max_memory_allocated() / 2**30 if on_gpu else None

    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    result_gpu, result_host, result_cprofile, errors = None, None, None, {}

    # 1. light profile: GPU busy / idle
    try:
        gc.collect()
        with profile(activities=activities) as prof:
            host_ms = _profiled_steps(args.profile_steps, tag="light")
        path = f"/tmp/trace_light_{os.getpid()}.json"
        prof.export_chrome_trace(path)
        del prof
        size = os.path.getsize(path)
        result_gpu = gpu_summary(path, args.profile_steps)
        result_gpu["host_clock_wall_ms"], result_gpu["trace_bytes"] = host_ms, size
        os.unlink(path)
        log(f"light profile: wall {result_gpu['wall_ms']:.1f} ms/step, GPU busy {result_gpu['gpu_busy_ms']:.1f} ms/step")
    except Exception as error:  # keep the other measurements
        errors["light_profile"] = f"{type(error).__name__}: {error}"
        log("light profile failed:", errors["light_profile"])

    # 2. stack profile: host time by category and function
    try:
        gc.collect()
        with profile(activities=activities, with_stack=True) as prof:
            host_ms = _profiled_steps(args.profile_steps)
        t1 = time.perf_counter()
        tree = prof.profiler.kineto_results.experimental_event_tree()
        result_host = attribute(tree, "_profiled_steps", args.profile_steps)
        result_host["analysis_s"] = time.perf_counter() - t1
        result_host["host_clock_wall_ms"] = host_ms
        del tree, prof
        c = result_host["categories_ms"]
        log(f"stack profile: wall {result_host['wall_ms']:.1f} ms/step; zero3 own {c['zero3_py']:.1f}, "
            f"incl {result_host['inclusive_ms'].get('zero3_py', 0):.1f}; checkpoint own {c['checkpoint_py']:.1f}; "
            f"events {result_host['events']}; analysis {result_host['analysis_s']:.1f} s")
    except Exception as error:
        import traceback
        traceback.print_exc()
        errors["stack_profile"] = f"{type(error).__name__}: {error}"

    # 3. cProfile, wall clock
    if args.cprofile:
        try:
            gc.collect()
            profiler = cProfile.Profile(time.perf_counter)
            t0 = time.perf_counter()
            profiler.enable()
            _profiled_steps(args.profile_steps)
            profiler.disable()
            wall = time.perf_counter() - t0
            stats = pstats.Stats(profiler).stats
            own = collections.Counter()
            ncalls = collections.Counter()
            cat_own = collections.Counter()
            for (path, line, func), (cc, nc, tt, ct, callers) in stats.items():
                key = f"{short_path(path)}({line}): {func}" if path != "~" else re.sub(r" at 0x[0-9a-f]+", "", func)
                own[key] += tt
                ncalls[key] += nc
                cat_own[py_category(path) if path != "~" else "builtin"] += tt
            n = args.profile_steps
            result_cprofile = {
                "wall_ms": wall * 1e3 / n,
                "own_total_ms": sum(own.values()) * 1e3 / n,
                "categories_ms": {k: v * 1e3 / n for k, v in cat_own.items()},
                "checkpoint_functions": [[k, v * 1e3 / n, ncalls[k] / n] for k, v in own.most_common()
                                         if k.startswith("torch/utils/checkpoint.py")],
                "top_functions": [[k, v * 1e3 / n, ncalls[k] / n] for k, v in own.most_common(60)],
                "top_ds_functions": [[k, v * 1e3 / n, ncalls[k] / n] for k, v in own.most_common()
                                     if k.startswith(("deepspeed/", "op_builder/"))][:40],
            }
            log(f"cProfile: wall {result_cprofile['wall_ms']:.1f} ms/step, zero3 own "
                f"{result_cprofile['categories_ms'].get('zero3_py', 0):.1f} ms/step")
        except Exception as error:
            errors["cprofile"] = f"{type(error).__name__}: {error}"
            log("cProfile failed:", errors["cprofile"])

    loss_values = [float(x) for x in losses]
    result = {
        "variant": args.variant,
        "label": args.label,
        "mode": mode,
        "use_reentrant": reentrant,
        "tree": ds_path,
        "tree_head": open(os.path.join(os.path.dirname(ds_path), "HEAD.txt")).read().strip()
                     if ds_path and os.path.exists(os.path.join(os.path.dirname(ds_path), "HEAD.txt")) else None,
        "deepspeed": ds_version,
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "device": torch.cuda.get_device_name() if on_gpu else "cpu",
        "shape": {k: getattr(args, k) for k in ("layers", "hidden", "seq", "batch")},
        "step_s": {"median": statistics.median(times), "min": min(times), "max": max(times), "n": len(times),
                   "all": times},
        "peak_gib": peak,
        "loss_first": loss_values[0],
        "loss_last": loss_values[-1],
        "profile_steps": args.profile_steps,
        "gpu": result_gpu,
        "host": result_host,
        "cprofile": result_cprofile,
        "errors": errors,
        "run_s": time.perf_counter() - t_start,
    }
    with open(args.out, "w") as out:
        json.dump(result, out, indent=1)
    log(f"wrote {args.out} ({result['run_s']:.1f} s after model build)")
    if mode == "ds":
        import deepspeed
        trainer.engine.destroy()
        deepspeed.comm.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# ---------------------------------------------------------------------------------------------
# The report


def fmt(value, digits=1):
    return "n/a" if value is None else f"{value:.{digits}f}"


def own_time_differences(results, rows):
    """Markdown lines: for each DeepSpeed run, the DeepSpeed functions whose cProfile own time differs
    most from the DeepSpeed run before it (in label order) of the same release: the series against the
    workaround, the follow-up against v0.19.8. Functions are matched without their line numbers, which a
    patch moves (same-named functions of one file are summed); only those in both runs' top lists count.
    The runs are separate processes, whose host may have been faster or slower: the median ratio of the
    own time of functions called equally often in both says by how much."""

    def by_name(run):
        own, calls = collections.Counter(), collections.Counter()
        for name, ms, n in (run.get("cprofile") or {}).get("top_ds_functions") or []:
            key = re.sub(r"\(\d+\): ", ": ", name)
            own[key] += ms
            calls[key] += n
        return own, calls

    lines = []
    runs = [r for r in results if r["mode"] == "ds"]
    for i, run in enumerate(runs):
        base = next((b for b in reversed(runs[:i]) if b["deepspeed"] == run["deepspeed"]), None)
        if base is None:
            continue
        (own, calls), (base_own, base_calls) = by_name(run), by_name(base)
        common = [k for k in own if k in base_own]
        if not common:
            continue
        same_calls = [own[k] / base_own[k] for k in common if calls[k] == base_calls[k] and base_own[k] > 0]
        speed = (f" Functions called equally often in both ({len(same_calls)}) took a median "
                 f"{statistics.median(same_calls):.2f} times as long in {run['label']}'s process.") if same_calls else ""
        lines += ["", f"DeepSpeed functions whose own time differs most, {run['label']} against {base['label']} "
                  f"(cProfile, ms and calls per profiled step; functions in both runs' top lists, line numbers "
                  f"dropped).{speed}", "",
                  f"| function | {base['label']} own ms | calls | {run['label']} own ms | calls | difference ms |",
                  "|---|---|---|---|---|---|"]
        for key in sorted(common, key=lambda k: -abs(own[k] - base_own[k]))[:rows]:
            lines.append(f"| `{key}` | {base_own[key]:.2f} | {base_calls[key]:.0f} | {own[key]:.2f} | "
                         f"{calls[key]:.0f} | {own[key] - base_own[key]:+.2f} |")
    return lines


def report(paths, md_path, rows):
    results = []
    for path in paths:
        try:
            results.append(json.load(open(path)))
        except Exception as error:
            print(f"skipping {path}: {error}", file=sys.stderr)
    results.sort(key=lambda r: r["label"])
    lines = []
    if results:
        r = results[0]
        lines += [
            f"{r['device']}, torch {r['torch']}, Python {r['python']}; Llama {r['shape']['layers']} layers, hidden "
            f"{r['shape']['hidden']}, batch {r['shape']['batch']} x {r['shape']['seq']} tokens, LoRA r=16 on q/k/v/o, "
            "bf16, world size 1. Step: median [min, max] over the timed steps (host clock, synchronized each step). "
            "GPU columns (ms/step) from torch.profiler without stacks: kernel = summed kernel time, busy = union of "
            "kernel/memcpy/memset intervals in the step, idle = unprofiled median step - busy (in brackets: idle "
            "inside the profiled step), host phases = forward / backward / optimizer host time, sync = host time "
            "in cuda*Synchronize. Host columns (ms per profiled step, wall clock, all threads) from cProfile: own "
            "time per category; the profiler inflates host time: compare its step wall with the median.",
            "",
            "| # | variant | step (s) median [min, max] | GPU kernel | GPU busy | GPU idle [profiled] | host phases f / b / o "
            "| sync | cProfile step wall | ZeRO-3 py own | other DS py own | checkpoint py own | other py own "
            "| C calls own | peak GiB |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
    lumped = False
    for r in results:
        s, g, cp = r["step_s"], r.get("gpu") or {}, r.get("cprofile") or {}
        c = cp.get("categories_ms", {})
        busy = g.get("gpu_busy_ms")
        idle = s["median"] * 1e3 - busy if busy is not None else None
        kinds, phases = g.get("by_kind_ms", {}), g.get("phase_host_ms", {})
        tree = f"DeepSpeed {r['deepspeed']}" if r["deepspeed"] else "torch only"
        variant = f"{tree}, {'reentrant' if r['use_reentrant'] else 'non-reentrant'}"
        if r.get("tree_head"):
            variant += f" (`{r['tree_head'][:7]}`)"
        # runs made before short_path() knew site-packages: checkpoint and model Python went into torch_py
        old = bool(c) and "checkpoint_py" not in c and "model_py" not in c
        lumped |= old
        ckpt = "(in other py)" if old else fmt(c.get("checkpoint_py", 0.0) if c else None)
        other_py = sum(c.get(k, 0.0) for k in ("model_py", "torch_py", "other_py", "checkpoint_py" if old else "_")) if c else None
        lines.append(
            f"| {r['label']} | {variant} | {s['median']:.3f} [{s['min']:.3f}, {s['max']:.3f}] | "
            f"{fmt(kinds.get('kernel', kinds.get('nccl')) if kinds else None)} | {fmt(busy)} | "
            f"{fmt(idle)} [{fmt(g.get('gpu_idle_ms'))}] | "
            + (" / ".join(fmt(phases.get(k)) for k in ("forward", "backward", "optimizer")) if phases else "n/a")
            + f" | {fmt(g.get('host_sync_wait_ms'))} | {fmt(cp.get('wall_ms'))} | {fmt(c.get('zero3_py', 0.0) if c else None)} | "
            f"{fmt(c.get('ds_other_py', 0.0) if c else None)} | {ckpt} | {fmt(other_py)} | "
            f"{fmt(c.get('builtin') if c else None)} | {fmt(r.get('peak_gib'), 2)} |")
    if lumped:
        lines += ["", "(in other py): these runs' cProfile categories lumped torch/utils/checkpoint.py and "
                  "transformers/peft into other py (the GPU host's interpreter lives under /opt/torch/, which an "
                  "older short_path() took for the torch package)."]
    errors = [(r["label"], r["errors"]) for r in results if r.get("errors")]
    if errors:
        lines += [""] + [f"- {label}: {e}" for label, e in errors]
    # the stack profile: inclusive ZeRO-3 time, checkpoint own time, per file
    stacked = [r for r in results if r.get("host")]
    if stacked:
        files = [f"deepspeed/runtime/zero/{f}" for f in ZERO3_FILES]
        lines += ["", "torch.profiler with_stack=True (ms per profiled step; its Python tracer is complete on the main "
                  "thread, but check threads_categories_ms in the JSON: on torch 2.11 it recorded the autograd "
                  "thread's Python in only one of two steps, so backward-side figures here are lower bounds):", "",
                  "| # | step wall | ZeRO-3 own | ZeRO-3 incl. | checkpoint own | checkpoint incl. | "
                  + " | ".join(f.rsplit("/", 1)[-1] for f in files) + " | other DS own | untraced |",
                  "|---|---|---|---|---|---|" + "---|" * (len(files) + 2)]
        for r in stacked:
            h = r["host"]
            c, inc, pf = h["categories_ms"], h["inclusive_ms"], h["per_file_ms"]
            other = sum(v for k, v in pf.items() if k not in files)
            lines.append(f"| {r['label']} | {fmt(h['wall_ms'])} | {fmt(c['zero3_py'])} | {fmt(inc.get('zero3_py', 0.0))} | "
                         f"{fmt(c['checkpoint_py'])} | {fmt(inc.get('checkpoint_py', 0.0))} | "
                         + " | ".join(fmt(pf.get(f, 0.0)) for f in files) + f" | {fmt(other)} | {fmt(h['untraced_ms'])} |")
    for r in (r for r in results if r["mode"] == "ds"):
        cp = (r.get("cprofile") or {}).get("top_ds_functions")
        st = {k: v for k, v, _ in ((r.get("host") or {}).get("top_ds_functions") or [])}
        if not cp:
            continue
        lines += ["", f"Top {rows} DeepSpeed functions by own time, {r['label']} (cProfile, ms and calls per profiled "
                  "step; the stack profile's own time beside it):", "",
                  "| function | own ms | calls | stack own ms |", "|---|---|---|---|"]
        for name, own, calls in cp[:rows]:
            lines.append(f"| `{name}` | {own:.2f} | {calls:.0f} | {fmt(st.get(name), 2)} |")
    lines += own_time_differences(results, rows)
    text = "\n".join(lines) + "\n"
    if md_path:
        with open(md_path, "w") as md:
            md.write(text)
    print(text)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", choices=sorted(VARIANTS))
    parser.add_argument("--label")
    parser.add_argument("--out")
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--profile-steps", type=int, default=2)
    parser.add_argument("--no-cprofile", dest="cprofile", action="store_false")
    parser.add_argument("--device", choices=["cuda", "cpu"])
    parser.add_argument("--threads", type=int, default=1, help="torch threads on CPU")
    parser.add_argument("--report", nargs="+", metavar="JSON")
    parser.add_argument("--md")
    parser.add_argument("--rows", type=int, default=15)
    args = parser.parse_args()
    if args.report:
        report(args.report, args.md, args.rows)
    elif args.variant and args.out:
        args.label = args.label or args.variant
        run(args)
    else:
        parser.error("give --variant and --out, or --report")


if __name__ == "__main__":
    main()
