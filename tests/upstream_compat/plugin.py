"""pytest plugin: run upstream-style DistributedTest methods on rank processes (loaded by run.py with -p).

For a test method of a class with ``is_dist_test``, the normal call is replaced: for each world size, a pool
of rank processes (tests.harness.RankPool, configured from the class's attributes) runs
``<module>:<Class>.<method>`` with the method's fixture and parameter values; a failure on any rank fails the
test with that rank's traceback, and a pytest.skip on any rank skips it. A world size larger than the host can
run (more ranks than visible GPUs on CUDA, or than ZERO3_WORLD_SIZE says) is skipped with the reason, as
upstream's harness skips when "not enough GPUs are available".
"""

import inspect
import sys
import warnings
from pathlib import Path

import pytest

from tests.harness import RankPool, world
from tests.harness.pool import close_zygotes, default_device, keep_logs_under
from tests.harness.report import WorldSizeReport

# Pools kept for the classes that set reuse_dist_env, keyed by (class, world size).
_reused = {}


_choice = None
_report = None


def _world_choice():
    global _choice
    if _choice is None:
        try:
            _choice = world.session_choice(default_device())
        except world.WorldSizeError as e:
            raise pytest.UsageError(str(e)) from None
    return _choice


def pytest_configure(config):
    global _report
    config.addinivalue_line("markers", "world_size(n): run this DistributedTest method on n ranks")
    _report = WorldSizeReport(_world_choice)
    config.pluginmanager.register(_report, "zero3-world-size-report")


@pytest.fixture(scope="session", autouse=True)
def harness_tmpdir(tmp_path_factory):
    """Rank and zygote logs go into pytest's temporary directory, as in our own suite (tests/conftest.py)."""
    keep_logs_under(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="class")
def class_tmpdir(request, tmpdir_factory):
    """A temporary directory shared by the test methods of a class (upstream defines it on DistributedTest).

    Defined here rather than on the class: pytest 9 deprecates class-scoped fixtures written as methods.
    """
    return tmpdir_factory.mktemp(request.cls.__name__)


def _world_sizes(item, kwargs):
    # As upstream: a world_size mark on the method wins, then a world_size parameter, then the class attribute.
    for mark in getattr(item.function, "pytestmark", []):
        if mark.name == "world_size":
            world_size = mark.args[0]
            break
    else:
        world_size = kwargs.get("world_size", item.cls.world_size)
    return [world_size] if isinstance(world_size, int) else list(world_size)


def _method_kwargs(item):
    names = [n for n in inspect.signature(item.function).parameters if n != "self"]
    kwargs = {}
    for name in names:
        if name in item.funcargs:
            kwargs[name] = item.funcargs[name]
        else:
            try:
                kwargs[name] = item._request.getfixturevalue(name)
            except pytest.FixtureLookupError:
                pass  # a parameter with a default value that is no fixture
    return kwargs


def _pool(cls, world_size):
    key = (cls, world_size)
    pool = _reused.get(key)
    if pool is None:
        pool = RankPool(world_size, backend=cls.backend, init_distributed=cls.init_distributed,
                        set_dist_env=cls.set_dist_env, name=f"{cls.__name__}-ws{world_size}")
        if cls.reuse_dist_env:
            _reused[key] = pool
    return pool


def _run_distributed(item):
    __tracebackhide__ = True
    cls = item.cls
    if cls.requires_cuda_env:
        from deepspeed.accelerator import get_accelerator
        if not get_accelerator().is_available():
            pytest.skip("only supported in accelerator environments.")
    kwargs = _method_kwargs(item)
    target = f"{item.module.__name__}:{cls.__qualname__}.{item.function.__name__}"
    for world_size in _world_sizes(item, kwargs):
        shortfall = _world_choice().shortfall(world_size)
        if shortfall:
            _report.skip(item, f"not enough ranks for world_size={world_size}: {shortfall}")
        pool = _pool(cls, world_size)
        try:
            # The ranks import the test module by the name pytest gave it, from the same sys.path.
            outcome = pool.execute(target, kwargs, timeout=cls.exec_timeout, sys_path=sys.path)
        finally:
            if not cls.reuse_dist_env:
                pool.close()
        if outcome.failed:
            # The report names the rank and carries its traceback; this plugin's own frames would only add noise.
            pytest.fail(outcome.describe(), pytrace=False)
        if outcome.skipped:
            pytest.skip(outcome.skip_message)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    if not getattr(pyfuncitem.cls, "is_dist_test", False):
        return None
    _run_distributed(pyfuncitem)
    return True


def _close_reused(cls=None):
    for key in [k for k in _reused if cls is None or k[0] is cls]:
        _reused.pop(key).close()


def pytest_runtest_teardown(item, nextitem):
    cls = getattr(item, "cls", None)
    if getattr(cls, "reuse_dist_env", False) and getattr(nextitem, "cls", None) is not cls:
        _close_reused(cls)


def pytest_sessionfinish(session):
    _close_reused()
    close_zygotes()


def pytest_report_header(config):
    # unit.common imports deepspeed in this process anyway; say which tree is under test. (Warnings raised while
    # importing it here would print outside pytest's capture.)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import deepspeed
        from deepspeed.accelerator import get_accelerator
    return (f"deepspeed {deepspeed.__version__.strip()} from {Path(deepspeed.__file__).parent}, "
            f"accelerator {get_accelerator().device_name()}")
