"""Self-test of tests/upstream_compat: an upstream-style test file in a throwaway tree, run by its runner."""

import os
import subprocess
import sys
import textwrap
import time
import xml.etree.ElementTree as ET

from tests.harness.pool import REPO_ROOT

UPSTREAM_STYLE_TESTS = '''
import os

import pytest
import torch

import deepspeed
import deepspeed.comm as dist
from deepspeed.accelerator import get_accelerator
from unit.common import DistributedTest


def _mark(name):
    # Each rank leaves a file behind, so that the outer test can see which ranks and sizes ran.
    out = os.environ["COMPAT_SELFTEST_OUT"]
    open(os.path.join(out, f"{name}-ws{dist.get_world_size()}-rank{dist.get_rank()}"), "w").close()


class TestPasses(DistributedTest):
    world_size = 2

    def test_all_reduce(self):
        assert os.environ["WORLD_SIZE"] == "2" and os.environ["RANK"] == os.environ["LOCAL_RANK"]
        t = torch.ones(1, device=get_accelerator().current_device_name()) * (dist.get_rank() + 1)
        dist.all_reduce(t)
        assert t.item() == 3
        _mark("passes")


@pytest.mark.parametrize("scale", [1, 2])
class TestParametrized(DistributedTest):
    world_size = 2
    reuse_dist_env = True

    @pytest.mark.parametrize("offset", [0, 10])
    def test_sum(self, scale, offset, class_tmpdir):
        device = get_accelerator().current_device_name()
        t = torch.full((1, ), float(scale * dist.get_rank() + offset), device=device)
        dist.all_reduce(t)
        assert t.item() == scale + 2 * offset
        assert class_tmpdir.basename.startswith("TestParametrized")
        _mark(f"sum-{scale}-{offset}-pid{os.getpid()}")

    @pytest.mark.world_size(1)
    def test_single(self, scale):
        assert dist.get_world_size() == 1


class TestEverySize(DistributedTest):
    world_size = [1, 2]

    def test_sizes(self):
        _mark("sizes")


class TestOwnInit(DistributedTest):
    init_distributed = False

    def test_init_in_body(self):
        assert not dist.is_initialized()
        deepspeed.init_distributed(dist_backend=self.backend)
        dist.barrier()
        _mark("own-init")


class TestSkipAndFail(DistributedTest):
    reuse_dist_env = True

    def test_skips_on_rank_0(self):
        if dist.get_rank() == 0:
            pytest.skip("rank 0 has nothing to check")

    def test_fails_on_rank_1(self):
        assert dist.get_rank() != 1, "rank 1 disagrees"
'''


def test_upstream_style_file_runs_with_the_stand_in_harness(tmp_path, world_choice):
    tree = tmp_path / "tree"
    test_dir = tree / "tests" / "unit" / "v1" / "zero"
    test_dir.mkdir(parents=True)
    (test_dir / "test_compat_selftest.py").write_text(textwrap.dedent(UPSTREAM_STYLE_TESTS))
    out = tmp_path / "out"
    out.mkdir()
    junit = tmp_path / "junit.xml"
    env = dict(os.environ, COMPAT_SELFTEST_OUT=str(out))
    # The tree has no deepspeed/, so the installed one is used (the runner warns about it).
    proc = subprocess.run([sys.executable, "-m", "tests.upstream_compat.run", str(tree), f"--junitxml={junit}", "-q"],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    log = proc.stdout + proc.stderr
    if world_choice.shortfall(2):
        _check_two_rank_tests_skipped(junit, out, proc, log, world_choice.shortfall(2))
        return
    assert proc.returncode == 1, log  # one test fails on purpose

    results = _junit_results(junit)
    expected = {
        "test_all_reduce": "passed",
        "test_sum[0-1]": "passed",
        "test_sum[0-2]": "passed",
        "test_sum[10-1]": "passed",
        "test_sum[10-2]": "passed",
        "test_single[1]": "passed",
        "test_single[2]": "passed",
        "test_sizes": "passed",
        "test_init_in_body": "passed",
        "test_skips_on_rank_0": "skipped",
        "test_fails_on_rank_1": "failure",
    }
    assert {k: v for k, v in results.items() if not k.endswith(":text")} == expected, log

    assert "rank 0 has nothing to check" in results["test_skips_on_rank_0:text"]
    failure = results["test_fails_on_rank_1:text"]
    assert "rank 1 raised AssertionError: rank 1 disagrees" in failure
    assert "in test_fails_on_rank_1" in failure  # the rank's traceback

    marks = sorted(p.name for p in out.iterdir())
    assert {"passes-ws2-rank0", "passes-ws2-rank1", "own-init-ws2-rank0", "own-init-ws2-rank1", "sizes-ws1-rank0",
            "sizes-ws2-rank0", "sizes-ws2-rank1"} <= set(marks)
    # reuse_dist_env: the four test_sum runs of a rank share one process.
    sum_pids = {m.rsplit("-pid", 1)[1] for m in marks if m.startswith("sum-")}
    assert len([m for m in marks if m.startswith("sum-")]) == 8 and len(sum_pids) == 2, marks


def _junit_results(junit):
    """{test name: passed|failure|error|skipped, test name + ":text": the message of a non-pass}."""
    results = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = child.tag
                results[case.get("name") + ":text"] = (child.get("message") or "") + (child.text or "")
        results[case.get("name")] = outcome
    return results


def _check_two_rank_tests_skipped(junit, out, proc, log, shortfall):
    """A host that runs fewer than 2 ranks (one GPU, or ZERO3_WORLD_SIZE=1): the 2-rank tests skip with the
    reason, the 1-rank ones run, and nothing fails."""
    assert proc.returncode == 0, log
    results = _junit_results(junit)
    ran = {"test_single[1]", "test_single[2]"}
    names = [k for k in results if not k.endswith(":text")]
    assert len(names) == 11, log
    assert {k: results[k] for k in names} == {k: "passed" if k in ran else "skipped" for k in names}, log
    for name in set(names) - ran:
        assert f"not enough ranks for world_size=2: {shortfall}" in results[name + ":text"], results
    # TestEverySize ran its world size 1 before the skip of world size 2, as upstream's harness does.
    assert sorted(p.name for p in out.iterdir()) == ["sizes-ws1-rank0"]
    assert "ran ranks at world size 1" in proc.stdout and "skipped for want of ranks" in proc.stdout, log


def _tree_without_user_backward(tmp_path):
    """(tree, its tests/unit/v1/zero): a tree with upstream's harness but not test_zero_user_backward.py."""
    tree = tmp_path / "tree"
    zero = tree / "tests" / "unit" / "v1" / "zero"
    zero.mkdir(parents=True)
    (tree / "tests" / "unit" / "__init__.py").write_text("")
    (tree / "tests" / "unit" / "common.py").write_text("# upstream's harness\n")
    return tree, zero


def test_a_tree_without_upstreams_user_backward_file_runs_with_the_stand_in(tmp_path):
    """Upstream's lifecycle tests import unit/v1/zero/test_zero_user_backward.py, which the master snapshot
    leaves out: the runner runs a scratch copy of the tree's tests with the stand-in there, the tree untouched."""
    tree, zero = _tree_without_user_backward(tmp_path)
    (zero / "test_lifecycle_like.py").write_text(
        textwrap.dedent('''
        from unit.v1.zero.test_zero_user_backward import get_config_dict


        def test_stage_3_partitions_every_param():
            assert get_config_dict(3)["zero_optimization"]["stage3_param_persistence_threshold"] == 0
        '''))
    proc = subprocess.run(
        [sys.executable, "-m", "tests.upstream_compat.run",
         str(tree), str(zero / "test_lifecycle_like.py"), "-q"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout
    assert sorted(p.name for p in zero.iterdir()) == ["test_lifecycle_like.py"]


def test_runs_of_one_tree_at_once_do_not_share_a_scratch_copy(tmp_path):
    """Four runs of one tree at once (one per GPU, as on the device machine) each get their own scratch copy:
    with a shared one, each run deleted the copy the others were running from."""
    tree, zero = _tree_without_user_backward(tmp_path)
    (zero / "test_slow.py").write_text(
        textwrap.dedent('''
        import os
        import time


        def test_its_copy_stays():
            time.sleep(4)
            assert os.path.exists(__file__), "the scratch copy this run runs from was deleted"
        '''))
    scratch = REPO_ROOT / "build" / "upstream-compat"
    before = set(scratch.glob("tree-*"))
    procs = []
    for _ in range(2):
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "tests.upstream_compat.run", str(tree), str(zero / "test_slow.py"), "-q"],
            cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        time.sleep(2)  # the first run is inside its test when the second one prepares its copy
    outputs = [proc.communicate(timeout=600)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], "\n".join(outputs)
    assert set(scratch.glob("tree-*")) == before, "a run left its scratch copy behind"
