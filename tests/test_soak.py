"""Soak: 100 optimizer steps of tiny Llama + PEFT LoRA with non-reentrant gradient checkpointing
and gradient accumulation 2 (tests/scenarios/soak.py), on 2 ranks. About 80 s on 2 CPU cores."""

import pytest

from tests.harness import RankPool
from tests.test_frozen_ckpt import scenario_runner

STEPS = 100
FIRST = 10  # RSS is compared from here on: the allocator and torch's caches settle in the first steps


@pytest.fixture(scope="module")
def soak_pool(rank_pool):
    # transformers and PEFT are heavy to import and change global state: ranks of their own
    pool = RankPool(rank_pool.world_size, name="soak")
    yield pool
    pool.close()


@pytest.mark.needs_patch(7)
@pytest.mark.invariants("I1", "I7", "I8")
def test_llama_lora_soak(soak_pool, request, capsys):
    """Quiescence and the counter after every backward and step, the forward stack after every
    forward, and host memory that does not grow.

    The bound on RSS growth from step 10 to step 100: less than half the model's parameter bytes
    per step, over the 90 steps. A lifecycle leak that keeps memory keeps at least a parameter's
    gathered copy or a step's saved activations (each larger than that per step here) alive; a
    leak of Python objects only (stack entries, ledger entries) is caught by the checks above, not
    by RSS. Measured on the series: about 1 MiB from step 10 to 100, most of it by step 20, against
    a bound of about 4 MiB."""
    values = scenario_runner(soak_pool, request)("tests.scenarios.soak:llama_lora_soak", steps=STEPS)
    if values is None:  # a tree without the series: the scenario failed, as it must
        return
    for rank, result in enumerate(values):
        rss = result["rss"]
        growth = rss[STEPS] - rss[FIRST]
        bound = (STEPS - FIRST) * result["model_bytes"] // 2
        with capsys.disabled():
            print(f"\nsoak rank {rank}: RSS {rss[FIRST] / 2**20:.2f} MiB at step {FIRST}, {rss[STEPS] / 2**20:.2f} MiB "
                  f"at step {STEPS} (growth {growth / 2**20:.2f} MiB, bound {bound / 2**20:.2f} MiB); loss "
                  f"{result['losses'][0]:.3f} -> {result['losses'][-1]:.3f}")
        assert growth < bound, (f"rank {rank}: RSS grew by {growth / 2**20:.2f} MiB from step {FIRST} to {STEPS} "
                                f"(bound {bound / 2**20:.2f} MiB): {rss}")
