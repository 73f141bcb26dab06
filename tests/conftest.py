"""Fixtures for distributed scenarios: one reused pool of rank processes per world size for the whole session.

Environment: ZERO3_TEST_DEVICE=cpu|cuda (gloo or NCCL; default cpu), ZERO3_WORLD_SIZE (default 2, or
--world-size), ZERO3_TEST_TIMEOUT (seconds a run may take, default 300), ZERO3_TEST_GRACE (seconds the other
ranks get after one fails, default 5), ZERO3_POOL_START_TIMEOUT (default 600), ZERO3_TEST_LOG_DIR (keep the
rank logs there), ZERO3_TEST_SHM_OP=1 (let DeepSpeed JIT-build its CPU shm comm op, as a stock install does).
"""

import os

import pytest

from tests.harness import RankPool
from tests.harness.pool import close_zygotes, default_device

# Per-base expectations (ZERO3_VERSION, the v0198 marker): tests/bases.py
pytest_plugins = ("tests.bases", )


def pytest_addoption(parser):
    group = parser.getgroup("zero3", "ZeRO-3 distributed scenarios")
    group.addoption("--world-size", type=int, default=None,
                    help="ranks per scenario for the rank_pool fixture (default: $ZERO3_WORLD_SIZE or 2)")


def pytest_configure(config):
    config.addinivalue_line("markers", "scenario: a distributed scenario (uses the rank_pool fixture)")
    # Keep DeepSpeed's accelerator choice identical in this process and the ranks, should a test import it here.
    os.environ.setdefault("DS_ACCELERATOR", default_device())


def _default_world_size(config):
    return config.getoption("--world-size") or int(os.environ.get("ZERO3_WORLD_SIZE") or 2)


def pytest_report_header(config):
    return f"zero3 harness: device={default_device()} world_size={_default_world_size(config)}"


def pytest_collection_modifyitems(items):
    # Tests that use the rank pool are marked so that "-m 'not scenario'" selects the quick ones.
    for item in items:
        if {"rank_pool", "rank_pools"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.scenario)


class RankPools:
    """One lazily started RankPool per world size, shared by the whole session."""

    def __init__(self, default_world_size):
        self.default_world_size = default_world_size
        self._pools = {}

    def __call__(self, world_size=None):
        world_size = world_size or self.default_world_size
        if world_size not in self._pools:
            self._pools[world_size] = RankPool(world_size, name=f"ws{world_size}")
        return self._pools[world_size]

    def close(self):
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
        close_zygotes()


@pytest.fixture(scope="session")
def rank_pools(request):
    """Callable: rank_pools(world_size=None) -> the session's RankPool of that size."""
    pools = RankPools(_default_world_size(request.config))
    yield pools
    pools.close()


@pytest.fixture(scope="session")
def rank_pool(rank_pools):
    """The session's RankPool of the default world size; rank_pool.run("tests.scenarios.m:f", **kwargs)."""
    return rank_pools()
