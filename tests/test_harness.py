"""Tests of the distributed harness itself (tests/harness): results, failures, hangs, deaths, cleanup."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.harness import RankPool, ScenarioFailed, rank_context
from tests.harness.pool import REPO_ROOT

# ----- scenario bodies used below (module level, so that the ranks can import them by name) ----------------------


def describe_rank(*, tag):
    import deepspeed.comm as dist
    ctx = rank_context()
    return (tag, ctx.rank, ctx.world_size, str(ctx.device), dist.get_rank(), os.environ["RANK"])


def raise_on_rank_1(*, message):
    import deepspeed.comm as dist
    if rank_context().rank == 1:
        raise ValueError(message)
    dist.barrier()  # rank 0 waits for rank 1 forever, as a real peer of a failed rank does


def hang_forever():
    while True:
        time.sleep(0.1)


def exit_on_rank_1(*, code):
    import deepspeed.comm as dist
    if rank_context().rank == 1:
        os._exit(code)
    dist.barrier()


def skip_on_rank_0():
    if rank_context().rank == 0:
        pytest.skip("nothing to check on rank 0")
    return "ran"


def set_env_and_return_pid():
    os.environ["ZERO3_HARNESS_TEST_LEAK"] = "1"
    return os.getpid()


def read_env():
    return os.environ.get("ZERO3_HARNESS_TEST_LEAK")


# ----- tests -----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pool(tmp_path_factory, rank_pools):
    # A pool of its own: these tests break it on purpose, which must not cost the scenario pool a restart. It has
    # the session's world size (1 on a host with one GPU); the tests about a peer of a failing rank need 2.
    with RankPool(rank_pools.default_world_size, log_dir=tmp_path_factory.mktemp("rank-logs"),
                  name="harness-test") as p:
        yield p


def _gone(pid):
    """True when the process no longer runs (a zombie waiting for its reaper counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return True


def test_returns_per_rank_values(pool):
    n = pool.world_size
    devices = ["cpu"] * n if pool.device == "cpu" else [f"cuda:{r}" for r in range(n)]
    assert pool.run(describe_rank, tag="x") == [("x", r, n, devices[r], r, str(r)) for r in range(n)]
    # The demo scenario, by name: rank r contributes 3 * (r + 1).
    assert pool.run("tests.scenarios.smoke:all_reduce_sum", value=3) == [3.0 * n * (n + 1) / 2] * n


def test_reuses_processes_and_restores_env(pool):
    pids = pool.run(set_env_and_return_pid)
    assert pool.run(read_env) == [None] * pool.world_size
    assert pool.run(set_env_and_return_pid) == pids == pool.pids


@pytest.mark.needs_ranks(2)
def test_rank_error_reports_traceback_and_hung_peer(pool):
    pool.run(describe_rank, tag="warm")
    old_pids = pool.pids
    with pytest.raises(ScenarioFailed) as info:
        pool.run(raise_on_rank_1, message="boom on one rank", timeout=60, grace=1)
    text = str(info.value)
    assert "rank 1 raised ValueError: boom on one rank" in text
    assert "rank 0 hung: no answer 1 s after rank 1 failed" in text
    # The raising rank's traceback comes first, then the hung rank's stacks (faulthandler's dump).
    assert text.index("rank 1 traceback") < text.index("rank 0 log")
    assert 'in raise_on_rank_1\n    raise ValueError(message)' in text
    assert "in raise_on_rank_1" in text[text.index("rank 0 log"):]
    outcome = info.value.outcome
    assert [r.status for r in outcome.ranks] == ["hung", "error"]
    assert outcome.elapsed < 30
    assert not pool.alive and all(_gone(pid) for pid in old_pids)
    zygote = pool.zygote_pid
    assert pool.run(describe_rank, tag="again")[1][:3] == ("again", 1, pool.world_size)
    assert set(pool.pids).isdisjoint(old_pids)
    # On CPU the new ranks come from the same zygote, which imported DeepSpeed once for the whole session.
    assert pool.zygote_pid == zygote and (zygote is None) == (not pool.fork)


def test_hang_times_out(pool):
    pool.run(describe_rank, tag="warm")
    t0 = time.monotonic()
    with pytest.raises(ScenarioFailed) as info:
        pool.run(hang_forever, timeout=2)
    assert time.monotonic() - t0 < 10
    text = str(info.value)
    ranks = ", ".join(str(r) for r in range(pool.world_size))
    assert f"rank{'s' if pool.world_size > 1 else ''} {ranks} timed out: no answer within 2 s; killed" in text
    assert "in hang_forever" in text  # the stacks dumped before the kill
    assert pool.run(describe_rank, tag="after hang")[0][0] == "after hang"


@pytest.mark.needs_ranks(2)
def test_dead_rank_is_detected(pool):
    pool.run(describe_rank, tag="warm")
    with pytest.raises(ScenarioFailed) as info:
        pool.run(exit_on_rank_1, code=7, timeout=60, grace=1)
    text = str(info.value)
    print(text)
    assert "rank 1 died: exit code 7" in text
    # gloo notices the closed connection, so the peer usually raises rather than hangs; either way it is
    # reported after the dead rank, the cause.
    assert "rank 0 hung" in text or "rank 0 raised" in text
    assert text.index("rank 1 died") < text.index("rank 0 ")
    assert pool.run(describe_rank, tag="after death")[0][0] == "after death"


def test_skip_on_one_rank_skips_the_test(pool):
    with pytest.raises(pytest.skip.Exception, match="rank 0: nothing to check on rank 0"):
        pool.run(skip_on_rank_0)
    assert pool.alive  # a clean skip leaves the pool usable


def test_close_leaves_no_process(pool):
    pool.run(describe_rank, tag="warm")
    pids = pool.pids
    pool.close()
    assert all(_gone(pid) for pid in pids)


def test_ranks_exit_when_the_parent_is_killed(tmp_path, rank_pools):
    # A parent that starts a pool and is then SIGKILLed (no cleanup code runs): its ranks must not survive it.
    script = textwrap.dedent(f"""
        import os, signal, sys
        from tests.harness import RankPool
        pool = RankPool({rank_pools.default_world_size}, log_dir={str(tmp_path)!r})
        pool.start()
        print(" ".join(map(str, pool.pids + [pool.zygote_pid or pool.pids[0]])), flush=True)
        sys.stdin.read(1)
        os.kill(os.getpid(), signal.SIGKILL)
        """)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO_ROOT, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]  # the ranks and the zygote
        assert len(pids) == rank_pools.default_world_size + 1 and not any(_gone(pid) for pid in pids)
        proc.stdin.write("x")
        proc.stdin.flush()
        assert proc.wait(timeout=30) == -signal.SIGKILL
        deadline = time.monotonic() + 10
        while not all(_gone(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert all(_gone(pid) for pid in pids), pids
    finally:
        proc.kill()
        proc.wait()


def test_demo_scenario_on_the_session_pool(rank_pool, pool):
    n = rank_pool.world_size
    # By name: importing the scenario module here would import DeepSpeed into the pytest process for nothing.
    assert rank_pool.run("tests.scenarios.smoke:all_reduce_sum", value=2) == [2.0 * n * (n + 1) / 2] * n
    pool.start()
    assert rank_pool.zygote_pid == pool.zygote_pid  # one zygote serves every pool of the session
