"""What a scenario function can ask about the rank it runs on."""

import dataclasses

_current = None


@dataclasses.dataclass(frozen=True)
class RankContext:
    rank: int
    local_rank: int
    world_size: int
    device_type: str  # "cpu" or "cuda"
    backend: str  # "gloo" or "nccl"

    @property
    def device(self):
        # torch is imported lazily: the pytest parent imports this package but must not pay for torch.
        import torch
        if self.device_type == "cpu":
            return torch.device("cpu")
        return torch.device(self.device_type, self.local_rank)


def rank_context():
    """The RankContext of the current rank process; only valid inside a scenario run by a RankPool."""
    if _current is None:
        raise RuntimeError("rank_context() is only available inside a rank process started by tests.harness")
    return _current


def _set(ctx):
    global _current
    _current = ctx
