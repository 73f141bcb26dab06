"""Distributed test harness: run a scenario function on N rank processes that are started once and reused.

A scenario is a module-level function taking keyword arguments only; it runs on every rank, may call
``rank_context()`` for its rank, world size and device, and returns a picklable value::

    # tests/scenarios/example.py
    import deepspeed.comm as dist
    from tests.harness import rank_context

    def all_reduce_sum(*, value):
        ...

    # tests/test_example.py
    def test_example(rank_pool):
        assert rank_pool.run("tests.scenarios.example:all_reduce_sum", value=3) == [6, 6]

The pytest fixtures (``rank_pool``, ``rank_pools``) live in tests/conftest.py.
"""

from tests.harness.context import RankContext, rank_context
from tests.harness.pool import PoolStartError, RankOutcome, RankPool, RunOutcome, ScenarioFailed

__all__ = ["RankContext", "rank_context", "PoolStartError", "RankOutcome", "RankPool", "RunOutcome",
           "ScenarioFailed"]
