"""The world-size choice (tests/harness/world.py) without GPUs: the counts are given, not measured."""

import os
import stat
import subprocess
import sys
import textwrap

import pytest

from tests.harness import world
from tests.harness.pool import REPO_ROOT


@pytest.mark.parametrize("gpus, expected", [(1, 1), (2, 2), (8, 2)])
def test_cuda_runs_at_most_one_rank_per_gpu(gpus, expected):
    choice = world.choose("cuda", gpus=gpus)
    assert (choice.world_size, choice.capacity) == (expected, gpus)


def test_cpu_runs_the_requested_ranks_without_limit():
    choice = world.choose("cpu")
    assert (choice.world_size, choice.capacity, choice.gpus) == (2, None, None)
    assert choice.shortfall(64) is None


def test_override_wins_on_cpu_and_caps_what_may_start():
    choice = world.choose("cpu", override=1, source="ZERO3_WORLD_SIZE=1")
    assert (choice.world_size, choice.capacity) == (1, 1)
    assert choice.skip_reason(2) == "needs 2 ranks; this session runs 1 (ZERO3_WORLD_SIZE=1)"
    assert choice.shortfall(2) == "2 ranks required, 1 available (ZERO3_WORLD_SIZE=1)"
    assert choice.skip_reason(1) is None and choice.shortfall(1) is None


def test_override_below_the_gpu_count_on_cuda():
    choice = world.choose("cuda", gpus=4, override=1, source="--world-size 1")
    assert (choice.world_size, choice.capacity) == (1, 1)
    assert choice.skip_reason(2) == "needs 2 ranks; this session runs 1 (--world-size 1, 4 GPUs visible)"


def test_skip_reason_names_the_gpu_count():
    choice = world.choose("cuda", gpus=1)
    assert choice.skip_reason(2) == "needs 2 ranks; this session runs 1 (1 GPU visible)"
    assert choice.shortfall(2) == "2 ranks required, 1 available (1 GPU visible)"
    assert world.choose("cuda", gpus=2).skip_reason(2) is None


def test_more_ranks_than_gpus_is_refused():
    with pytest.raises(world.WorldSizeError, match="ZERO3_WORLD_SIZE=2 asks for 2 ranks, but only 1 GPU is visible"):
        world.choose("cuda", gpus=1, override=2, source="ZERO3_WORLD_SIZE=2")
    with pytest.raises(world.WorldSizeError, match="torch sees no GPU"):
        world.choose("cuda", gpus=0)


@pytest.mark.parametrize("text", ["0", "-1", "two", "", "1.5"])
def test_malformed_world_size_is_refused(text):
    with pytest.raises(world.WorldSizeError, match="expected a positive number of ranks"):
        world.parse_world_size(text, "ZERO3_WORLD_SIZE")


def test_session_choice_reads_the_environment(monkeypatch):
    monkeypatch.setenv("ZERO3_WORLD_SIZE", " 1 ")
    assert world.session_choice("cpu").world_size == 1
    assert world.session_choice("cpu", option=3).source == "--world-size 3"
    monkeypatch.delenv("ZERO3_WORLD_SIZE")
    assert world.session_choice("cpu").world_size == 2


def _fake_python(tmp_path, body):
    script = tmp_path / "python"
    script.write_text("#!/bin/sh\n" + body + "\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def test_visible_gpus_asks_a_child_interpreter(tmp_path):
    assert world.visible_gpus(_fake_python(tmp_path, "echo 'a warning'; echo 3")) == 3
    with pytest.raises(world.WorldSizeError, match="could not count GPUs with torch .exit 1.: no torch here"):
        world.visible_gpus(_fake_python(tmp_path, "echo 'no torch here' >&2; exit 1"))


def test_tally_counts_tests_by_world_size_and_outcome():
    tally = world.RunTally()
    tally.ran("a", {1})
    tally.outcome("a", "passed")
    tally.ran("b", {1})
    tally.outcome("b", "failed")
    tally.outcome("b", "passed")  # a later phase passing does not undo the failure
    tally.ran("c", {1, 2})
    tally.outcome("c", "passed")
    tally.outcome("d", "passed")  # ran no ranks: not counted
    tally.skipped_for_ranks("e", "needs 2 ranks; this session runs 1 (1 GPU visible)")
    tally.skipped_for_ranks("f", "needs 2 ranks; this session runs 1 (1 GPU visible)")
    assert tally.lines(world.choose("cuda", gpus=1)) == [
        "zero3 world size: 1 on cuda (1 GPU visible)",
        "  3 tests ran ranks at world size 1 (1 failed, 2 passed)",
        "  1 test ran ranks at world size 2 (1 passed)",
        "  2 tests skipped for want of ranks: needs 2 ranks; this session runs 1 (1 GPU visible)",
    ]


def test_summary_line_and_skip_in_a_pytest_session(tmp_path):
    # A session of its own, with a test that runs no ranks and one that needs 2: the skip reason and the
    # summary lines come from the conftest hooks, without starting a single rank process.
    test_file = tmp_path / "test_needs_two.py"
    test_file.write_text(textwrap.dedent("""
        import pytest

        @pytest.mark.needs_ranks(2)
        def test_two():
            pass

        def test_plain():
            pass
        """))
    env = dict(os.environ, ZERO3_WORLD_SIZE="1", ZERO3_TEST_DEVICE="cpu")
    # tests/conftest.py loaded as a plugin: the test file lies outside tests/, where it would not apply. A basetemp
    # of its own, so that this session does not prune the numbered temporary directories of other sessions.
    proc = subprocess.run([sys.executable, "-m", "pytest", "-rs", "-p", "no:cacheprovider", "-p", "tests.conftest",
                           "-c", str(REPO_ROOT / "pytest.ini"), "--basetemp", str(tmp_path / "basetemp"),
                           str(test_file)], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log
    assert "world_size=1 (ZERO3_WORLD_SIZE=1)" in proc.stdout, log
    assert "SKIPPED [1] " in proc.stdout and "needs 2 ranks; this session runs 1 (ZERO3_WORLD_SIZE=1)" in log
    assert "zero3 world size: 1 on cpu (ZERO3_WORLD_SIZE=1)" in proc.stdout, log
    assert "1 test skipped for want of ranks" in proc.stdout, log
