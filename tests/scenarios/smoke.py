"""The smallest real scenario: one all_reduce through deepspeed.comm, checking that the pool's group works."""

import torch

import deepspeed.comm as dist
from tests.harness import rank_context


def all_reduce_sum(*, value=1):
    """Every rank contributes value * (rank + 1); every rank returns the reduced sum."""
    ctx = rank_context()
    assert dist.get_rank() == ctx.rank and dist.get_world_size() == ctx.world_size
    t = torch.tensor([float(value * (ctx.rank + 1))], device=ctx.device)
    dist.all_reduce(t)
    return t.item()
