#!/usr/bin/env python3
"""The ZeRO-3 paths that only run on a GPU, on one DeepSpeed tree: one JSON line per case.

    PYTHONPATH=<deepspeed tree> python scripts/gpu_config_matrix.py --label followup [--layers 4]

Cases, each in a process of its own (world size 1, NCCL):
  llama-<config>: the benchmark's model (scripts/bench_lifecycle.py: random-init Llama + PEFT LoRA on
      q/k/v/o, bf16, built under deepspeed.zero.Init, non-reentrant checkpointing on every layer),
      three steps with ZeRO-3 defaults plus one of: nothing (defaults), overlap_comm, parameters and
      optimizer offloaded to CPU (offload), DeepSpeed's engine.compile() (compile). Reports the losses,
      the step time of the last step and the peak memory, or the error.
  reentrant-twice-<overlap>: one layer applied twice under use_reentrant=True checkpointing (a
      gradient reduced twice in one micro-step; overlap_comm on and off, the first runs the reduce
      stream), fp32, compared with torch autograd on the same weights: the largest gradient error.
"""

import argparse
import json
import os
import subprocess
import sys
import time
import traceback

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
LLAMA_CONFIGS = {
    "defaults": {},
    "overlap_comm": {"overlap_comm": True},
    "offload": {"offload_param": {"device": "cpu"}, "offload_optimizer": {"device": "cpu"}},
    "compile": {},
}


def _init_dist():
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    import deepspeed
    deepspeed.init_distributed()


def llama_case(config_name, args):
    import torch
    import deepspeed
    from deepspeed.accelerator import get_accelerator
    sys.path.insert(0, SCRIPTS)
    from bench_lifecycle import bench_ds_config, build_model
    ds_config = bench_ds_config(args.batch, **LLAMA_CONFIGS[config_name])
    ds_config["zero_force_ds_cpu_optimizer"] = False  # torch's AdamW with the optimizer offloaded
    torch.manual_seed(0)
    model = build_model(argparse.Namespace(hidden=args.hidden, layers=args.layers, seq=args.seq,
                                           variant="series"), ds_config)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
                                      config=ds_config)
    if config_name == "compile":
        engine.compile()
    ids = torch.randint(0, 32000, (args.batch, args.seq), generator=torch.Generator().manual_seed(1)).to(engine.device)
    accelerator = get_accelerator()
    losses, seconds = [], 0.0
    for _ in range(3):
        accelerator.synchronize()
        start = time.perf_counter()
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        accelerator.synchronize()
        seconds = time.perf_counter() - start
        losses.append(round(loss.item(), 6))
    return {"losses": losses, "last_step_s": round(seconds, 3),
            "peak_gib": round(accelerator.max_memory_allocated() / 2**30, 3)}


def reentrant_twice_case(overlap, args):
    import torch
    import deepspeed
    from torch.utils.checkpoint import checkpoint

    class Model(torch.nn.Module):

        def __init__(self):
            super().__init__()
            self.layer, self.head = torch.nn.Linear(64, 64), torch.nn.Linear(64, 1)

        def forward(self, x):
            for _ in range(2):
                x = checkpoint(self.layer, x, use_reentrant=True)
            return self.head(x).pow(2).mean()

    from deepspeed.accelerator import get_accelerator
    device = get_accelerator().current_device_name()
    torch.manual_seed(0)
    reference = Model().to(device)
    model = Model()
    model.load_state_dict(reference.state_dict())
    x = torch.randn(4, 64, device=device, requires_grad=True)
    reference(x).backward()
    config = {"train_micro_batch_size_per_gpu": 4,
              "optimizer": {"type": "Adam", "params": {"lr": 0.0, "torch_adam": True}},
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0, "overlap_comm": overlap,
                                    "reduce_bucket_size": 64 * 64 + 64}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    engine.backward(engine(x.detach().requires_grad_()))
    from deepspeed.utils import safe_get_full_grad
    errors = {name: (safe_get_full_grad(p).float() - dict(reference.named_parameters())[name].grad).abs().max().item()
              for name, p in engine.module.named_parameters()}
    return {"max_grad_error": max(errors.values()), "per_param": errors}


def child(case, args):
    _init_dist()
    kind, _, name = case.partition(":")
    try:
        result = llama_case(name, args) if kind == "llama" else reentrant_twice_case(name == "overlap", args)
        result["ok"] = True
    except Exception as e:  # reported, not raised: the next case still runs
        result = {"ok": False, "error": f"{type(e).__name__}: {e}"[:400], "where": traceback.format_exc()[-800:]}
    print("RESULT " + json.dumps({"case": case, **result}), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--label", required=True, help="name of the tree in the output")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--cases", nargs="*",
                        default=[f"llama:{c}" for c in LLAMA_CONFIGS] + ["twice:overlap", "twice:plain"])
    parser.add_argument("--case-timeout", type=int, default=300, help="seconds a case may take (default 300)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child, args)
    for port, case in enumerate(args.cases, start=29541):
        env = dict(os.environ, MASTER_PORT=str(port))
        cmd = [sys.executable, __file__, "--label", args.label, "--layers", str(args.layers), "--hidden",
               str(args.hidden), "--seq", str(args.seq), "--batch", str(args.batch), "--child", case]
        start = time.monotonic()
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.case_timeout)
        except subprocess.TimeoutExpired:
            print(json.dumps({"case": case, "ok": False, "error": f"timed out after {args.case_timeout} s",
                              "tree": args.label}), flush=True)
            continue
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        result = json.loads(lines[-1][7:]) if lines else {"case": case, "ok": False,
                                                          "error": f"exit {proc.returncode}: {proc.stderr[-600:]}"}
        result.update(tree=args.label, seconds=round(time.monotonic() - start, 1))
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
