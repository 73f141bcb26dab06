"""tests/upstream_suite.py without running DeepSpeed: where the tests come from, how two runs compare,
and what a missing snapshot does. The runs themselves are tox -e upstream and upstream-v0198."""

import io
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests import upstream_suite as suite
from tests.harness.pool import REPO_ROOT


def _fake_tests(root, with_user_backward=False):
    unit = root / "tests" / "unit"
    (unit / "v1" / "zero").mkdir(parents=True)
    (unit / "common.py").write_text("# upstream's harness\n")
    if with_user_backward:
        (unit / "v1" / "zero" / "test_zero_user_backward.py").write_text("# upstream's own\n")
    return root / "tests"


def test_a_regression_is_a_test_that_passed_on_pristine_and_does_not_patched():
    pristine = {"a": "passed", "b": "passed", "c": "failed", "d": "skipped", "e": "passed", "f": "passed"}
    patched = {"a": "passed", "b": "failed", "c": "passed", "d": "failed", "e": "skipped", "g": "passed"}
    lines, regressions = suite.compare(pristine, patched)
    assert regressions == 3  # b failed, e skipped, f missing
    regressed = sorted(line.split()[1].rstrip(":") for line in lines if "REGRESSION" in line)
    assert regressed == ["b", "e", "f"]
    assert any(line.strip() == "c: failed -> passed" for line in lines)
    assert any(line.strip() == "g: missing -> passed" for line in lines)


def test_outcomes_are_read_from_junit_xml(tmp_path):
    junit = tmp_path / "junit.xml"
    junit.write_text('<testsuites><testsuite>'
                     '<testcase classname="unit.a.TestX" name="test_ok"/>'
                     '<testcase classname="unit.a.TestX" name="test_bad"><failure message="x"/></testcase>'
                     '<testcase classname="unit.a.TestX" name="test_err"><error message="x"/></testcase>'
                     '<testcase classname="unit.a.TestX" name="test_skip"><skipped message="x"/></testcase>'
                     '<testcase classname="" name="unit.b"><error message="collection"/></testcase>'
                     '</testsuite></testsuites>')
    assert suite._outcomes(junit) == {"unit.a.TestX::test_ok": "passed", "unit.a.TestX::test_bad": "failed",
                                      "unit.a.TestX::test_err": "failed", "unit.a.TestX::test_skip": "skipped",
                                      "unit.b": "failed"}


@pytest.mark.parametrize("as_tgz", [False, True])
def test_the_stand_in_fills_in_only_a_missing_user_backward_file(tmp_path, as_tgz):
    tree = tmp_path / "tree"
    (tree / "deepspeed").mkdir(parents=True)
    source = _fake_tests(tmp_path / "snapshot")
    if as_tgz:
        with tarfile.open(tmp_path / "snapshot.tgz", "w:gz") as tgz:
            tgz.add(source, arcname="tests")
        source = tmp_path / "snapshot.tgz"
    tests_dir, _, standin = suite.prepare(tree, str(source), tmp_path / "scratch")
    assert standin
    copied = tests_dir / "unit" / "v1" / "zero" / "test_zero_user_backward.py"
    assert copied.read_text() == suite.STANDIN.read_text()

    own = tmp_path / "own"
    _fake_tests(own, with_user_backward=True)
    tests_dir, _, standin = suite.prepare(own, None, tmp_path / "scratch2")
    assert not standin
    assert (tests_dir / "unit" / "v1" / "zero" / "test_zero_user_backward.py").read_text() == "# upstream's own\n"


def test_a_missing_snapshot_skips_with_its_path(tmp_path):
    for tree in ("a", "b"):
        (tmp_path / tree / "deepspeed").mkdir(parents=True)
        (tmp_path / tree / "deepspeed" / "__init__.py").write_text("")
    missing = tmp_path / "nowhere" / "deepspeed-tests-v0.19.2.tgz"
    proc = subprocess.run([sys.executable, "-m", "tests.upstream_suite", "compare", str(tmp_path / "a"),
                           str(tmp_path / "b"), "--tests", str(missing)], cwd=REPO_ROOT, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"skipped: upstream's tests not found at {missing}")


def test_series_test_paths_are_the_test_files_the_series_adds_or_modifies(tmp_path):
    tree = tmp_path / "tree"
    _fake_tests(tree)
    (tree / "tests" / "unit" / "v1" / "zero" / "test_old.py").write_text("")
    (tree / "tests" / "unit" / "v1" / "zero" / "test_untouched.py").write_text("")

    def git(*args):
        subprocess.run(["git", "-C", str(tree), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                       capture_output=True)

    git("init", "-q", "-b", "zero3/v9")
    git("add", "-A")
    git("commit", "-q", "-m", "base")
    base = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    git("config", "branch.zero3/v9.zero3base", base)
    (tree / "tests" / "unit" / "common.py").write_text("# changed\n")  # a helper, not a test file
    (tree / "tests" / "unit" / "v1" / "zero" / "test_new.py").write_text("")
    (tree / "tests" / "unit" / "v1" / "zero" / "test_old.py").write_text("def test_added():\n    pass\n")
    git("add", "-A")
    git("commit", "-q", "-m", "series")
    assert suite.series_test_paths(tree) == ["unit/v1/zero/test_new.py", "unit/v1/zero/test_old.py"]


def _junit(path, cases):
    path.write_text("<testsuites><testsuite>" + "".join(
        f'<testcase classname="unit.a.TestX" name="{name}">{"<failure/>" if outcome == "failed" else ""}</testcase>'
        for name, outcome in cases.items()) + "</testsuite></testsuites>")


def test_by_file_reports_resume_and_a_file_without_report_keeps_what_its_output_shows(tmp_path, monkeypatch, capsys):
    tests_dir = tmp_path / "tests"
    for name in ("test_a.py", "test_b.py", "test_c.py", "test_d.py", "test_e.py", "test_f.py"):
        (tests_dir / "unit" / "zero").mkdir(parents=True, exist_ok=True)
        (tests_dir / "unit" / "zero" / name).write_text("")
    units = suite._test_files(tests_dir, ["unit/zero"])
    assert units == [f"unit/zero/test_{x}.py" for x in "abcdef"]
    assert suite._shard(units, "2/2") == ["unit/zero/test_b.py", "unit/zero/test_d.py", "unit/zero/test_f.py"]
    with pytest.raises(SystemExit, match="K/N"):
        suite._shard(units, "3/2")

    out = tmp_path / "reports"
    out.mkdir()
    _junit(out / suite._report_name("unit/zero/test_a.py"), {"test_kept": "passed"})  # from an earlier run
    ran, killed = [], []
    # pytest's verbose output (colours, a test writing to the terminal before its outcome), or xdist's
    output = {
        "test_c.py": ["\x1b[1mcollecting ... \x1b[0mcollected 3 items\n",
                      "unit/zero/test_c.py::TestY::test_one[0] \x1b[32mPASSED\x1b[0m [ 33%]\n",
                      "unit/zero/test_c.py::test_two [rank0] a warning\n", "XFAIL [ 66%]\n",
                      "unit/zero/test_c.py::TestY::test_p[a::b] PASSED [ 70%]\n",
                      "unit/zero/test_c.py::TestY::test_hangs "],  # killed before its outcome and newline
        "test_d.py": ["nothing but a crash\n", "ERROR: a message a test printed\n"],
        "test_f.py": ["unit/zero/test_f.py::test_ok PASSED [100%]\n", "===== warnings summary =====\n",
                      "unit/zero/test_f.py::test_ok\n", "===== short test summary info =====\n",
                      "FAILED unit/zero/test_f.py::test_ok - no, it passed\n"],
        "test_e.py": ["unit/zero/test_e.py::test_bad \n", "unit/zero/test_e.py::test_stuck \n",
                      "unit/zero/test_e.py::test_fine \n", "[gw1] [ 33%] FAILED unit/zero/test_e.py::test_bad \n",
                      "[gw0] [ 66%] PASSED unit/zero/test_e.py::test_fine \n"],
    }

    class FakePytest:  # test_b writes its report; test_c outlives the timeout, the others crash

        def __init__(self, cmd, **kwargs):
            unit, junit = cmd[-1], cmd[-2].split("=", 1)[1]
            ran.append(unit)
            if unit.endswith("test_b.py"):
                _junit(Path(junit), {"test_ok": "passed", "test_bad": "failed"})
            self.stdout = io.StringIO("".join(output.get(unit.rsplit("/", 1)[-1], [])))
            self.pid = 0

        def poll(self):
            if ran[-1].endswith("test_c.py"):
                return -9 if killed else None
            return 0 if ran[-1].endswith("test_b.py") else -11

        def wait(self, timeout=None):
            if self.poll() is None:
                raise subprocess.TimeoutExpired("pytest", timeout)
            return self.poll()

    monkeypatch.setattr(suite.subprocess, "Popen", FakePytest)
    monkeypatch.setattr(suite.os, "killpg", lambda pid, sig: killed.append(pid))
    # the lock of an op the stopped pytest was building would make every later test wait forever
    extensions = tmp_path / "extensions"
    (extensions / "op").mkdir(parents=True)
    (extensions / "op" / "lock").write_text("")
    (extensions / "op" / "op.so").write_text("")
    outcomes = suite._run_by_file(["pytest"], tests_dir, {}, units, out, 60, "t", extensions)
    assert not (extensions / "op" / "lock").exists() and (extensions / "op" / "op.so").exists()
    assert ran == [f"unit/zero/test_{x}.py" for x in "bcdef"]  # test_a's report was kept
    assert outcomes == {
        "unit.a.TestX::test_kept": "passed", "unit.a.TestX::test_ok": "passed", "unit.a.TestX::test_bad": "failed",
        # the tests that finished before the timeout keep their outcomes; the one that was running fails
        "unit.zero.test_c.TestY::test_one[0]": "passed", "unit.zero.test_c::test_two": "skipped",
        "unit.zero.test_c.TestY::test_p[a::b]": "passed", "unit.zero.test_c.TestY::test_hangs": "failed",
        "unit/zero/test_d.py": "failed",  # no test named: the file fails
        # with pytest-xdist, every test a worker started and did not finish fails
        "unit.zero.test_e::test_bad": "failed", "unit.zero.test_e::test_fine": "passed",
        "unit.zero.test_e::test_stuck": "failed",
        "unit.zero.test_f::test_ok": "passed", "unit/zero/test_f.py": "failed",
    }
    assert killed == [0] and not list(out.glob("*.partial"))
    # the runner's own line starts a line, also after pytest was stopped in the middle of one
    printed = capsys.readouterr().out
    assert "test_hangs == t: [" not in printed and "\n== t: [3/6] unit/zero/test_c.py:" in printed
    assert "outlived --file-timeout 60 s" in (out / suite._report_name("unit/zero/test_c.py")).read_text()


def test_only_passed_in_runs_only_the_tests_that_passed_on_pristine(tmp_path, monkeypatch, capsys):
    pristine, out = tmp_path / "pristine", tmp_path / "patched"
    pristine.mkdir()
    # the node ids pytest prints, as a pristine report records them (a nested class, a module-level
    # function, a parameter id holding "::")
    suite._write_failed_report(pristine / suite._report_name("unit/zero/test_c.py"), "unit/zero/test_c.py", "", [
        "unit/zero/test_c.py::TestY::test_one[0] PASSED [ 20%]\n",
        "unit/zero/test_c.py::TestY::TestInner::test_deep PASSED [ 40%]\n",
        "unit/zero/test_c.py::test_two PASSED [ 60%]\n", "unit/zero/test_c.py::TestY::test_p[a::b] PASSED [ 80%]\n",
        "unit/zero/test_c.py::TestY::test_broken FAILED [ 90%]\n", "unit/zero/test_c.py::test_skip SKIPPED [100%]\n"])
    _junit(pristine / suite._report_name("unit/zero/test_d.py"), {"test_bad": "failed"})
    ran = []

    class FakePytest:

        def __init__(self, cmd, **kwargs):
            cut = next(i for i, arg in enumerate(cmd) if arg.startswith("--junitxml="))
            ran.append(cmd[cut + 1:])
            _junit(Path(cmd[cut].split("=", 1)[1]), {"test_one[0]": "passed"})
            self.stdout, self.pid = io.StringIO(""), 0

        def poll(self):
            return 0

        def wait(self, timeout=None):
            return 0

    monkeypatch.setattr(suite.subprocess, "Popen", FakePytest)
    units = ["unit/zero/test_c.py", "unit/zero/test_d.py"]
    suite._run_by_file(["pytest"], tmp_path, {}, units, out, 60, "t", only_passed_in=pristine)
    assert ran == [["unit/zero/test_c.py::TestY::test_one[0]", "unit/zero/test_c.py::TestY::TestInner::test_deep",
                    "unit/zero/test_c.py::test_two", "unit/zero/test_c.py::TestY::test_p[a::b]"]]
    assert "unit/zero/test_d.py: passes no test in" in capsys.readouterr().out
    assert not (out / suite._report_name("unit/zero/test_d.py")).exists()
    # a PATH that names tests inside a file (file::Class) selects from that unit's own pristine report
    unit = "unit/zero/test_c.py::TestY"
    suite._write_failed_report(pristine / suite._report_name(unit), unit, "", [
        "unit/zero/test_c.py::TestY::test_one[0] PASSED [ 50%]\n", "unit/zero/test_c.py::TestY::test_x FAILED [100%]\n"])
    suite._run_by_file(["pytest"], tmp_path, {}, [unit], out, 60, "t", only_passed_in=pristine)
    assert ran[-1] == ["unit/zero/test_c.py::TestY::test_one[0]"]
    with pytest.raises(SystemExit, match="test_e.py.xml does not exist: run unit/zero/test_e.py on the pristine tree"):
        suite._run_by_file(["pytest"], tmp_path, {}, ["unit/zero/test_e.py"], out, 60, "t", only_passed_in=pristine)


def test_diff_compares_the_files_both_results_hold(tmp_path, capsys):
    pristine, patched = tmp_path / "pristine", tmp_path / "patched"
    pristine.mkdir()
    patched.mkdir()
    _junit(pristine / "a.xml", {"test_1": "passed", "test_2": "failed"})
    _junit(patched / "a.xml", {"test_1": "failed", "test_2": "passed"})
    _junit(pristine / "b.xml", {"test_3": "passed"})  # not run on the patched tree yet
    assert suite.diff(pristine, patched) == 1
    out = capsys.readouterr().out
    assert "only the pristine results have b.xml: not compared" in out
    assert "REGRESSION unit.a.TestX::test_1: passed -> failed" in out
    assert "compared 1 file(s)" in out
    # --brief counts the changes by kind and still names the regression
    assert suite.diff(pristine, patched, brief=True) == 1
    out = capsys.readouterr().out
    assert "  1 failed -> passed\n  1 passed -> failed\n  REGRESSION unit.a.TestX::test_1: passed -> failed" in out
    assert "unit.a.TestX::test_2" not in out
    assert "only the pristine results have b.xml: not compared" in out  # b passes a test on pristine
    _junit(pristine / "c.xml", {"test_4": "failed"})
    suite.diff(pristine, patched, brief=True)
    out = capsys.readouterr().out
    assert "  1 file(s) in which pristine passes no test: not run on this side" in out and "c.xml" not in out
    _junit(patched / "a.xml", {"test_1": "passed", "test_2": "passed"})
    assert suite.diff(pristine, patched) == 0
