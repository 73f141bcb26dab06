#!/usr/bin/env python3
"""Memory, all-gather traffic and step time of ZeRO-3 + LoRA + activation checkpointing, on GPUs.

One variant per invocation; each runs on WORLD_SIZE GPUs (spawned here, NCCL) and writes one JSON
file. `--report` turns the JSON files into the Markdown table and PNG plot the RFC includes.

    PYTHONPATH=<deepspeed tree> python scripts/bench_lifecycle.py --variant series --out bench/series.json
    python scripts/bench_lifecycle.py --report bench/*.json --md docs/_generated/bench.md --png docs/_generated/bench.png

Variants: series (patched tree, non-reentrant checkpointing on every decoder layer), reentrant
(use_reentrant=True: the downstream workaround), no-ckpt (no checkpointing: the reference), and
nonreentrant (non-reentrant on whatever tree PYTHONPATH names; on pristine v0.19.2 it crashes,
which is reported as such). The model is a random-init Llama (nothing downloaded) with PEFT LoRA
on q/k/v/o, bf16, built under deepspeed.zero.Init as Hugging Face does under ZeRO-3.
"""

import argparse
import json
import os
import statistics
import sys
import time

# the all-gather counter is shared with the test scenarios
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

VARIANTS = {"series": "nonreentrant", "nonreentrant": "nonreentrant", "reentrant": "reentrant", "no-ckpt": "none"}


def build_model(args, ds_config):
    import deepspeed
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
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": mode == "reentrant"})
        if mode == "reentrant":
            # reentrant checkpointing needs an input that requires grad to produce any gradient
            model.enable_input_require_grads()
    return model


def run_rank(rank, args):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(args.world_size))
    import torch
    import deepspeed
    from deepspeed.accelerator import get_accelerator
    from tests.scenarios.zero3 import count_all_gathers
    accelerator = get_accelerator()
    accelerator.set_device(rank)
    deepspeed.init_distributed(dist_backend=accelerator.communication_backend_name())
    ds_config = {
        "train_micro_batch_size_per_gpu": args.batch,
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
            "stage": 3
        },
    }
    torch.manual_seed(0)
    model = build_model(args, ds_config)
    engine, *_ = deepspeed.initialize(model=model,
                                      model_parameters=[p for p in model.parameters() if p.requires_grad],
                                      config=ds_config)
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

    times, losses, peaks, backward_peaks, gathered = [], [], [], [], []
    for step in range(args.warmup + args.steps):
        record[0] = step == args.warmup + args.steps - 1
        before = dict(counts)
        accelerator.synchronize()
        accelerator.reset_peak_memory_stats()
        start = time.perf_counter()
        loss = engine(input_ids=ids, labels=ids).loss
        accelerator.synchronize()
        forward_peak = accelerator.max_memory_allocated()
        accelerator.reset_peak_memory_stats()
        engine.backward(loss)
        accelerator.synchronize()
        backward_peak = accelerator.max_memory_allocated()
        engine.step()
        accelerator.synchronize()
        elapsed = time.perf_counter() - start
        if step >= args.warmup:
            times.append(elapsed)
            peaks.append(max(forward_peak, backward_peak))
            backward_peaks.append(backward_peak)
            gathered.append({k: counts[k] - before[k] for k in counts})
        losses.append(loss.item())
    result = {
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
            "n": len(times)
        },
        "peak_gib": max(peaks) / 2**30,
        "backward_peak_gib": max(backward_peaks) / 2**30,
        "allgather_gib_per_step": {
            k: statistics.median(g[k] for g in gathered) / 2**30
            for k in counts
        },
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "timeline_gib": [m / 2**30 for m in timeline],
    }
    if rank == 0:
        with open(args.out, "w") as out:
            json.dump(result, out, indent=1)
    engine.destroy()


def run_variant(args):
    import torch.multiprocessing as mp
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29600 + os.getpid() % 1000))
    try:
        mp.spawn(run_rank, args=(args, ), nprocs=args.world_size, join=True)
    except Exception as error:  # a crash (pristine non-reentrant) is a result too
        message = str(error).strip().splitlines()
        with open(args.out, "w") as out:
            json.dump({
                "variant": args.variant,
                "tree": os.environ.get("PYTHONPATH", ""),
                "error": message[-1][:300]
            },
                      out,
                      indent=1)
        print(f"{args.variant}: failed: {message[-1][:300]}", file=sys.stderr)


def report(paths, md_path, png_path):
    results = [json.load(open(p)) for p in paths]
    lines = [
        "| variant | tree | median step (s) [min, max] | peak alloc (GiB) | backward peak (GiB) | "
        "all-gather/step frozen (GiB) | trainable (GiB) | loss first → last |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        tree = os.path.basename(r.get("tree", "").rstrip("/")) or "installed"
        if "error" in r:
            lines.append(f"| {r['variant']} | {tree} | failed: {r['error']} | | | | | |")
            continue
        s = r["step_s"]
        lines.append(f"| {r['variant']} | {tree} | {s['median']:.3f} [{s['min']:.3f}, {s['max']:.3f}] | "
                     f"{r['peak_gib']:.2f} | {r['backward_peak_gib']:.2f} | "
                     f"{r['allgather_gib_per_step']['frozen']:.3f} | {r['allgather_gib_per_step']['trainable']:.3f} | "
                     f"{r['loss_first']:.3f} → {r['loss_last']:.3f} |")
    ok = [r for r in results if "error" not in r]
    if ok:
        r = ok[0]
        lines += [
            "",
            f"{r['gpu']} × {r['world_size']}, torch {r['torch']}, DeepSpeed {r['deepspeed']}; Llama "
            f"{r['shape']['layers']} layers, hidden {r['shape']['hidden']}, sequence {r['shape']['seq']}, "
            f"{r['shape']['batch']} per GPU, LoRA r=16 on q/k/v/o, bf16, ZeRO-3 defaults; step time over "
            f"{r['step_s']['n']} steps after warm-up; all-gather bytes counted at the parameters' gather calls.",
        ]
    with open(md_path, "w") as md:
        md.write("\n".join(lines) + "\n")
    if png_path and ok:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(8, 4))
        for r in ok:
            ax.plot(r["timeline_gib"], label=r["variant"])
        ax.set_xlabel("decoder-layer hook events in one step (forward, then backward)")
        ax.set_ylabel("allocated GiB (rank 0)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(png_path, dpi=120)


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
    parser.add_argument("--report", nargs="+", metavar="JSON")
    parser.add_argument("--md")
    parser.add_argument("--png")
    args = parser.parse_args()
    if args.report:
        if not args.md:
            parser.error("--report needs --md")
        report(args.report, args.md, args.png)
    elif args.variant and args.out:
        run_variant(args)
    else:
        parser.error("give --variant and --out, or --report")


if __name__ == "__main__":
    main()
