"""A long run of the Hugging Face client path: tiny Llama + PEFT LoRA, non-reentrant gradient
checkpointing, gradient accumulation 2, many optimizer steps. Leaks that one step hides (a
parameter left gathered, a stack entry, a deferred release, memory) add up here."""

import gc
import math

import torch

import deepspeed

from tests.scenarios.hf_llama import VOCAB, tiny_llama_lora
from tests.scenarios.zero3 import assert_forward_stack_clean, assert_quiescent, initialize, lifecycle_config


def rss_bytes():
    """This process's resident set size, from /proc (Linux)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def llama_lora_soak(*, steps=100, gas=2, rss_every=10):
    """Trains ``steps`` optimizer steps; after every backward and every step, ZeRO-3 must be
    quiescent (I1) with a non-negative counter (I7), and after every forward FWD_MODULE_STACK
    bounded (I8). Returns the losses and the RSS (after a gc) every ``rss_every`` steps."""
    config = lifecycle_config(gas=gas)
    torch.manual_seed(0)
    with deepspeed.zero.Init(config_dict_or_path=config):
        model = tiny_llama_lora(input_grads=False)
    engine = initialize(model, config)
    engine.train()
    model_bytes = sum(p.ds_numel * p.ds_tensor.element_size() for p in engine.module.parameters())
    losses, rss = [], {}
    try:
        for step in range(1, steps + 1):
            for micro in range(gas):
                # a few fixed batches, so that the loss can fall
                generator = torch.Generator().manual_seed((step * gas + micro) % 8)
                ids = torch.randint(0, VOCAB, (2, 8), generator=generator).to(engine.device)
                loss = engine(ids)
                assert_forward_stack_clean(engine, f"after the forward of step {step}, micro-batch {micro}")
                engine.backward(loss)
                assert_quiescent(engine, f"after the backward of step {step}, micro-batch {micro}")
                engine.step()
                losses.append(loss.item())
            assert_quiescent(engine, f"after optimizer step {step}")
            if step % rss_every == 0:
                gc.collect()
                rss[step] = rss_bytes()
    finally:
        engine.destroy()
    assert all(math.isfinite(loss) for loss in losses), losses
    return {"losses": losses, "rss": rss, "model_bytes": model_bytes}
