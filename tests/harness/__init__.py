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

``run(target, *, timeout=None, grace=None, **kwargs)`` takes a "module:function" string or the function itself
(``timeout`` and ``grace`` are the harness's own keywords) and returns the per-rank return values in rank order.
It raises ScenarioFailed (an AssertionError) when a rank raises, dies, or does not answer within ``timeout``
seconds (ZERO3_TEST_TIMEOUT, default 300); once one rank has failed, the others get ``grace`` seconds
(ZERO3_TEST_GRACE, default 5) before they count as hung. The report puts the cause first (a dead rank, else
the first traceback), then the hung ranks with the Python stacks they had when killed, each with the tail of
its log. After any failure the ranks are killed and the next run starts new ones; on CPU they are forked from a
"zygote" process that imported DeepSpeed once, so that costs about 0.1 s. A pytest.skip on any rank skips the
test. ``execute()`` returns the RunOutcome instead of raising.

The pytest fixtures (``rank_pool``, ``rank_pools``) and the environment variables are described in
tests/conftest.py.
"""

from tests.harness.context import RankContext, rank_context
from tests.harness.pool import PoolStartError, RankOutcome, RankPool, RunOutcome, ScenarioFailed

__all__ = ["RankContext", "rank_context", "PoolStartError", "RankOutcome", "RankPool", "RunOutcome",
           "ScenarioFailed"]
