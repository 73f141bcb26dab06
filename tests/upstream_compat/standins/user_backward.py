# Stand-in for upstream's tests/unit/v1/zero/test_zero_user_backward.py, which the master snapshot
# in ../shared/upstream-tests leaves out; written for this project, not copied. It provides the two
# helpers upstream's test_zero_activation_checkpoint_lifecycle.py imports from that file, as that
# file uses them. tests/upstream_suite.py puts it in place only when the real file is missing.

import torch

import deepspeed
import deepspeed.comm as dist
from deepspeed.accelerator import get_accelerator


def get_config_dict(stage, gradient_accumulation_steps=1, force_fp32=False):
    """A small ZeRO config at the given stage, in fp32 or in the accelerator's half dtype."""
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": gradient_accumulation_steps,
        "steps_per_print": 1_000_000,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
        "zero_optimization": {"stage": stage},
    }
    if stage == 3:
        # as upstream's: every parameter is partitioned, none kept whole for being small
        config["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    if not force_fp32:
        if get_accelerator().is_bf16_supported():
            config["bf16"] = {"enabled": True}
        elif get_accelerator().is_fp16_supported():
            config["fp16"] = {"enabled": True, "initial_scale_power": 8}
    return config


def initialize_distributed():
    """(device, rank, world size) of this rank, with deepspeed.comm initialised."""
    if not dist.is_initialized():
        deepspeed.init_distributed()
    device = torch.device(get_accelerator().current_device_name())
    return device, dist.get_rank(), dist.get_world_size()
