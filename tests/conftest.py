"""Fixtures for distributed scenarios: one reused pool of rank processes per world size for the whole session.

Environment: ZERO3_TEST_DEVICE=cpu|cuda (gloo or NCCL; default cpu), ZERO3_WORLD_SIZE (or --world-size;
default 2 ranks, on CUDA at most one per visible GPU: see tests/harness/world.py), ZERO3_TEST_TIMEOUT
(seconds a run may take, default 300), ZERO3_TEST_GRACE (seconds the other ranks get after one fails,
default 5), ZERO3_POOL_START_TIMEOUT (default 600), ZERO3_TEST_LOG_DIR (keep the rank logs there),
ZERO3_HARNESS_TMPDIR (where the pools make their log directories; default: pytest's basetemp),
ZERO3_TEST_SHM_OP=1 (let DeepSpeed JIT-build its CPU shm comm op, as a stock install does).
After the tests, a summary says how many tests ran rank processes at which world size."""

import os

import pytest

from tests.harness import RankPool, world
from tests.harness.pool import close_zygotes, default_device, keep_logs_under
from tests.harness.report import WorldSizeReport

_CHOICE = pytest.StashKey()
_REPORT = pytest.StashKey()

# Per-base expectations (ZERO3_VERSION, the v0198 marker): tests/bases.py
pytest_plugins = ("tests.bases", )


def pytest_addoption(parser):
    group = parser.getgroup("zero3", "ZeRO-3 distributed scenarios")
    group.addoption("--world-size", type=int, default=None,
                    help="ranks per scenario for the rank_pool fixture (default: $ZERO3_WORLD_SIZE, else 2 capped "
                         "by the visible GPUs on CUDA)")


def pytest_configure(config):
    config.addinivalue_line("markers", "scenario: a distributed scenario (uses the rank_pool fixture)")
    config.addinivalue_line("markers", "needs_ranks(n): skip unless the session's world size is at least n")
    # Keep DeepSpeed's accelerator choice identical in this process and the ranks, should a test import it here.
    os.environ.setdefault("DS_ACCELERATOR", default_device())
    config.stash[_REPORT] = WorldSizeReport(lambda: session_world_choice(config))
    config.pluginmanager.register(config.stash[_REPORT], "zero3-world-size-report")


def session_world_choice(config):
    """The session's WorldChoice (tests/harness/world.py), made once; a bad request stops the session."""
    if _CHOICE not in config.stash:
        try:
            config.stash[_CHOICE] = world.session_choice(default_device(), config.getoption("--world-size"))
        except world.WorldSizeError as e:
            raise pytest.UsageError(str(e)) from None
    return config.stash[_CHOICE]


def pytest_report_header(config):
    choice = session_world_choice(config)
    return f"zero3 harness: device={choice.device} world_size={choice.world_size} ({choice.why})"


def pytest_runtest_setup(item):
    mark = item.get_closest_marker("needs_ranks")
    if mark is not None:
        reason = session_world_choice(item.config).skip_reason(mark.args[0])
        if reason:
            item.config.stash[_REPORT].skip(item, reason)


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
def world_choice(request):
    """The session's WorldChoice: world_size of the scenario pools, capacity of the host, and why."""
    return session_world_choice(request.config)


@pytest.fixture(scope="session", autouse=True)
def harness_tmpdir(tmp_path_factory):
    """Rank and zygote logs go into pytest's temporary directory (the failure report names them)."""
    keep_logs_under(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="session")
def rank_pools(request):
    """Callable: rank_pools(world_size=None) -> the session's RankPool of that size."""
    pools = RankPools(session_world_choice(request.config).world_size)
    yield pools
    pools.close()


@pytest.fixture(scope="session")
def rank_pool(rank_pools):
    """The session's RankPool of the default world size; rank_pool.run("tests.scenarios.m:f", **kwargs)."""
    return rank_pools()


@pytest.fixture(scope="session")
def hf_pool(rank_pool):
    """Rank processes of their own for the Hugging Face scenarios (tests/test_hf_llama_peft.py,
    tests/test_v0198.py): transformers and PEFT are heavy to import and change global state
    (F.linear under zero.Init, logging), which the small scenarios should not share."""
    pool = RankPool(rank_pool.world_size, name="hf")
    yield pool
    pool.close()


@pytest.fixture(scope="module")
def fuzz_pool(rank_pool):
    """Rank processes of their own for lifecycle fuzz cases (tests/test_lifecycle_fuzz.py, the
    follow-up's fuzz findings in tests/test_v0198.py): a failing case kills its ranks, and the drawn
    models register z3 leaf flags and hooks on module instances only, but nothing else should share
    a failure's restart."""
    pool = RankPool(rank_pool.world_size, name="fuzz")
    yield pool
    pool.close()
