#!/usr/bin/env python3
"""Frozen and trainable bytes ZeRO-3 all-gathers per step on CPU, tiny Llama + PEFT LoRA, with and
without non-reentrant gradient checkpointing: the benchmark's comparison at toy size, on one rank.

    PYTHONPATH=<deepspeed tree>:. DS_ACCELERATOR=cpu python scripts/cpu_allgather_volume.py

As in scripts/bench_lifecycle.py, the run without checkpointing never calls
gradient_checkpointing_enable(), so it also lacks the enable_input_require_grads() hook that
transformers adds with checkpointing (that hook makes the first decoder layer run a backward toward
the leaf input, an inherent extra the ratio includes). Prints one line per variant and the ratio of
the last step (the first step records ZeRO-3's trace).
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def measure(checkpointing, steps):
    import torch
    from peft import get_peft_model
    from transformers import LlamaForCausalLM

    from tests.scenarios import hf_llama
    from tests.scenarios.followup import all_gathers_per_step
    from tests.scenarios.zero3 import initialize, lifecycle_config

    torch.manual_seed(0)
    model = get_peft_model(LlamaForCausalLM(hf_llama.tiny_llama_config()),
                           hf_llama.lora_config(),
                           autocast_adapter_dtype=False)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return all_gathers_per_step(initialize(hf_llama.CausalLMLoss(model), lifecycle_config()), steps)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    if args.steps < 2:
        parser.error("--steps must be at least 2: the first step records the trace")
    for name, value in dict(MASTER_ADDR="127.0.0.1", MASTER_PORT="29541", RANK="0", WORLD_SIZE="1",
                            LOCAL_RANK="0").items():
        os.environ.setdefault(name, value)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed
    from tests.harness.gloo import skip_shm_op_build
    skip_shm_op_build()
    deepspeed.init_distributed("gloo")
    print(f"deepspeed {deepspeed.__version__.strip()} from {os.path.dirname(deepspeed.__file__)}")
    volumes = {}
    for variant, checkpointing in (("no-ckpt", False), ("non-reentrant", True)):
        volumes[variant] = measure(checkpointing, args.steps)
        print(f"{variant}: bytes all-gathered per step {volumes[variant]}")
    last = {variant: steps[-1]["frozen"] for variant, steps in volumes.items()}
    print(f"frozen, last step: non-reentrant {last['non-reentrant']} / no-ckpt {last['no-ckpt']} = "
          f"{last['non-reentrant'] / last['no-ckpt']:.3f}x")


if __name__ == "__main__":
    main()
