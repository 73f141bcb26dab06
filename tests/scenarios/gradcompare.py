"""Exact gradient comparison that allows for the rounding of ZeRO's data-parallel average below the
smallest normal float.

ZeRO-3 averages gradients by pre-dividing each rank's gradient by the world size and then summing
the ranks' shares (deepspeed/runtime/comm/coalesced_collectives.py, reduce_scatter_coalesced:
``div_(world_sz)`` before the reduce-scatter). The scenarios feed every rank the same micro-batch,
so on 2 ranks ZeRO-3's gradient is ``g/2 + g/2`` where the torch reference has ``g``. Halving is
exact for every normal float whose half is normal too, so this equals ``g`` bit for bit, except
where ``g/2`` is subnormal (``|g| < 2**-125``): there it rounds to an even multiple of 2**-149 and
the sum can be off by 2**-149 per rank and micro-batch (the fuzzer's case of 1.4e-45: a micro-batch
gradient of exactly 2**-149 halves to 0). That is not a lifecycle bug, and no other comparison
would tell it apart from one.

The rule: elements equal, or differing by less than the smallest normal float32 (``finfo.tiny``,
2**-126, about 1.2e-38). Floats of magnitude 2**-103 (about 1e-31) or more are spaced at least that
far apart, so two of them that differ are told apart: gradients of any size training can notice
still compare exactly; NaN never compares equal.

Pure torch, no DeepSpeed: the tests' parent process imports it too.
"""

import torch


def below_normal_slack(dtype):
    """The largest difference the rule tolerates (exclusive) for ``dtype``."""
    return torch.finfo(dtype).tiny


def mismatched(grad, expected):
    """Boolean mask of the elements that differ by the rule (equal, or |diff| < smallest normal)."""
    if grad.shape != expected.shape or grad.dtype != expected.dtype:
        raise ValueError(f"cannot compare a {grad.dtype} gradient of shape {tuple(grad.shape)} with a "
                         f"{expected.dtype} one of shape {tuple(expected.shape)}")
    # (grad - expected).abs() < tiny is False for NaN, so a NaN on either side is a mismatch; equal
    # infinities are caught by the equality (their difference is NaN)
    return ~((grad == expected) | ((grad - expected).abs() < below_normal_slack(grad.dtype)))


def equal_up_to_subnormal(grad, expected):
    """Whether ``grad`` and ``expected`` match by the rule in every element."""
    return not bool(mismatched(grad, expected).any())
