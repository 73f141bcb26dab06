"""Run DeepSpeed's own unit tests (upstream's tests/, with upstream's harness) against a tree, or
compare a patched tree with its pristine release: no test may fail with the patches that passes
without them.

    python -m tests.upstream_suite run [--tests SRC] [--ranks N] [--junit FILE | --by-file DIR [--shard K/N]
                                       [--only-passed-in PRISTINE_DIR]] TREE [PATH ...] [-- ARG ...]
    python -m tests.upstream_suite compare [--tests SRC] [--ranks N] [--out DIR] PRISTINE PATCHED [PATH ...]
    python -m tests.upstream_suite diff PRISTINE_RESULTS PATCHED_RESULTS

TREE is a DeepSpeed tree (the deepspeed/ package; scripts/apply.sh makes one). Its own tests/ are used
when it has upstream's harness (tests/unit/common.py), as the v0.19.8 trees do (apply.sh adds upstream's
tests/ there, and the series' test changes with it); otherwise --tests names upstream's tests/: an
extracted copy (a directory holding tests/unit/common.py, or that tests/ directory itself) or a snapshot
.tgz from ../shared/upstream-tests. When SRC does not exist the command says so and exits 0 without
running anything (``skipped: ...``), so that a machine without the snapshots is not failed for it.

The tests run from a scratch copy under build/upstream-suite/ (the tree is never written to), with the
tree first on PYTHONPATH, LOCAL_SIZE=N (upstream's CPU accelerator runs tests of up to N ranks and skips
larger ones; default 2), DS_ACCELERATOR from ZERO3_TEST_DEVICE (default cpu), and a private
TORCH_EXTENSIONS_DIR unless one is set. PATHs are relative to tests/ (default, or "all": unit/runtime/zero,
unit/v1/zero and unit/runtime/activation_checkpointing); one the tests do not have is left out, saying so. When the snapshot lacks
unit/v1/zero/test_zero_user_backward.py, which upstream's lifecycle tests import, the stand-in in
tests/upstream_compat/standins/ takes its place.

``compare`` runs the same PATHs on both trees (pristine first) and prints each test whose outcome
differs; it exits 1 when a test that passed on PRISTINE fails, errors or is missing on PATCHED.

The whole of the three directories is about 800 tests, hours a tree on 2 cores. ``run --by-file DIR``
runs one pytest per test file and writes DIR/<file>.xml; a file whose report is already there is not run
again, so a run that was stopped goes on where it was, and ``--shard K/N`` (the K-th of every N files)
splits the files between processes or hosts that each write into their own DIR (or the same one).
``--only-passed-in PRISTINE_DIR`` runs, of each file, only the tests that passed in PRISTINE_DIR's report
of it (the others cannot regress; a file that passes none there is not run): a long file's patched run
then takes the time of its passing tests only. A
file's pytest that ends without a report, or outlives --file-timeout, keeps the outcomes of the tests its
output says finished, and the tests that were running (or, when none can be named, the file) are recorded as
failed. A --by-file run builds DeepSpeed's JIT ops in a TORCH_EXTENSIONS_DIR of its own (unless one is set),
so that the build locks a stopped pytest leaves can be removed; runs of one tree (and shard) share their
scratch copy and that directory, so run them one at a time. ``diff`` compares two such results (directories of reports, or single reports) as
``compare`` does, over the files both hold, and names the files only one of them holds; with --brief it
counts the changes by kind and names only the regressions.
"""

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
STANDIN = Path(__file__).resolve().parent / "upstream_compat" / "standins" / "user_backward.py"
DEFAULT_PATHS = ["unit/runtime/zero", "unit/v1/zero", "unit/runtime/activation_checkpointing"]
PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"


class Skip(Exception):
    """Nothing to run against: the reason is printed and the command exits 0."""


def _tests_source(tree, tests):
    """The tests/ directory to copy (or the .tgz to extract) for TREE."""
    own = tree / "tests"
    if (own / "unit" / "common.py").is_file():
        return own
    if tests is None:
        raise SystemExit(f"{tree} has no tests/unit/common.py (an sdist tree): pass --tests with upstream's tests/")
    src = Path(tests)
    if not src.exists():
        raise Skip(f"upstream's tests not found at {src} (an extracted copy of "
                   "../shared/upstream-tests/deepspeed-tests-*.tgz, or the .tgz itself)")
    if src.is_dir() and (src / "tests" / "unit" / "common.py").is_file():
        return src / "tests"
    if src.is_dir() and (src / "unit" / "common.py").is_file():
        return src
    if src.is_file() and src.name.endswith(".tgz"):
        return src
    raise SystemExit(f"{src} is neither upstream's tests/ (with unit/common.py), a directory holding it, nor a .tgz")


def prepare(tree, tests, scratch):
    """Copy TREE's tests (or SRC's) to SCRATCH/tests, with the stand-in where upstream's file is missing."""
    src = _tests_source(tree, tests)
    if scratch.exists():
        shutil.rmtree(scratch)
    scratch.mkdir(parents=True)
    if src.is_file():
        with tarfile.open(src) as tgz:
            members = [m for m in tgz.getmembers() if m.name == "tests" or m.name.startswith("tests/")]
            tgz.extractall(scratch, members=members, filter="data")
    else:
        shutil.copytree(src, scratch / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    user_backward = scratch / "tests" / "unit" / "v1" / "zero" / "test_zero_user_backward.py"
    standin = not user_backward.exists()
    if standin:
        shutil.copyfile(STANDIN, user_backward)
    return scratch / "tests", src, standin


def _outcomes(junit):
    """{test id: passed|failed|skipped} from a pytest JUnit XML file."""
    result = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        classname, name = case.get("classname", ""), case.get("name", "")
        test_id = f"{classname}::{name}" if classname else name
        if case.find("failure") is not None or case.find("error") is not None:
            result[test_id] = FAILED
        elif case.find("skipped") is not None:
            result[test_id] = SKIPPED
        else:
            result[test_id] = PASSED
    return result


def _test_file_from_elsewhere(path):
    """(path relative to tests/, file) for a test file given by a path outside the tree, e.g. another
    tree's version of a file: it is copied over the scratch copy's file of the same place."""
    parts = path.parts
    if "tests" not in parts:
        raise SystemExit(f"{path}: a test file outside the tree must lie under some tests/ directory")
    cut = len(parts) - 1 - parts[::-1].index("tests")
    return Path(*parts[cut + 1:])


def _report_name(unit):
    """The file name of a test file's (or node id's) report in a --by-file directory."""
    return unit.replace("/", "__").replace("::", "--") + ".xml"


# pytest's verbose progress: "NODE OUTCOME [ 40%]", the outcome on a later line when the test wrote to the
# terminal meanwhile; with pytest-xdist, "[gw0] [ 40%] OUTCOME NODE". It ends at the first section line
# after the session header (warnings, failures, the short summary), which name tests again.
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_NODE = re.compile(r"^(\S+\.py::\S+)\s*(.*)$")
_OUTCOME = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\s+\[\s*\d+%\]$")
_XDIST_OUTCOME = re.compile(r"^\[gw\d+\] \[\s*\d+%\] (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (\S+\.py::\S+)")
_SECTION = re.compile(r"^={3,} (?!test session starts)")
_JUNIT_OUTCOME = {"PASSED": PASSED, "XPASS": PASSED, "FAILED": FAILED, "ERROR": FAILED, "SKIPPED": SKIPPED,
                  "XFAIL": SKIPPED}


def _progress_outcomes(lines):
    """({node id: outcome} of the tests that pytest's output says finished, [node ids of the tests it
    started and did not finish]: one, or with pytest-xdist those its workers were running)."""
    finished, started, running = {}, {}, None
    for line in lines:
        line = _ANSI.sub("", line).strip()
        if _SECTION.match(line):
            break
        xdist = _XDIST_OUTCOME.match(line)
        if xdist:
            finished[xdist.group(2)] = _JUNIT_OUTCOME[xdist.group(1)]
            continue
        node = _NODE.match(line)
        if node:
            running, line = node.groups()
            started[running] = True
        outcome = _OUTCOME.match(line)
        if outcome and running:
            finished[running] = _JUNIT_OUTCOME[outcome.group(1)]
            running = None
    return finished, [node for node in started if node not in finished]


def _junit_case(node):
    """(classname, name) of a pytest node id as pytest's JUnit report names it (a parameter id may hold
    "::" too)."""
    base, bracket, params = node.partition("[")
    path, *rest = base.split("::")
    classname = path[:-len(".py")].replace("/", ".") if path.endswith(".py") else path
    if not rest:
        return "", node
    return ".".join([classname, *rest[:-1]]), rest[-1] + bracket + params


def _write_failed_report(junit, unit, message, output=()):
    """A report for a file whose pytest wrote none: the outcomes its OUTPUT shows, and MESSAGE as the error
    of the tests that were running (of the file, when no test can be named)."""
    finished, unfinished = _progress_outcomes(output)
    suite_el = ET.Element("testsuite")
    for node, outcome in finished.items():
        classname, name = _junit_case(node)
        case = ET.SubElement(suite_el, "testcase", classname=classname, name=name)
        if outcome != PASSED:
            ET.SubElement(case, "failure" if outcome == FAILED else "skipped", message=f"{outcome} (from pytest's output)")
    for classname, name in [_junit_case(node) for node in unfinished] or [("", unit)]:
        case = ET.SubElement(suite_el, "testcase", classname=classname, name=name)
        ET.SubElement(case, "error", message=message)
    root = ET.Element("testsuites")
    root.append(suite_el)
    ET.ElementTree(root).write(junit, encoding="unicode")


def _echo_and_keep(stream, lines):
    for line in stream:
        lines.append(line)
        try:
            sys.stdout.write(line)
            sys.stdout.flush()
        except (OSError, ValueError):
            pass  # a closed terminal must not stop the draining, or pytest would block on a full pipe


def _test_files(tests_dir, paths):
    """PATHS with every directory expanded to its test files (test_*.py, sorted), relative to tests/."""
    units = []
    for path in paths:
        if "::" not in path and (tests_dir / path).is_dir():
            units += sorted(str(f.relative_to(tests_dir)) for f in (tests_dir / path).rglob("test_*.py"))
        else:
            units.append(path)
    return list(dict.fromkeys(units))


def _passed_node_ids(unit, report):
    """pytest node ids of the tests of UNIT (a test file relative to tests/, or a node id in one) that
    passed in REPORT."""
    path = unit.partition("::")[0]
    module = path[:-len(".py")].replace("/", ".")
    nodes = []
    for test_id, outcome in _outcomes(report).items():
        classname, _, name = test_id.partition("::")  # (a class name holds no "::"; a parameter id may)
        if outcome != PASSED or not name or not (classname == module or classname.startswith(module + ".")):
            continue
        classes = classname[len(module) + 1:].split(".") if classname != module else []
        nodes.append("::".join([path, *classes, name]))
    return nodes


def _run_by_file(cmd, tests_dir, env, units, out_dir, file_timeout, label, extensions_dir=None, only_passed_in=None):
    """Run one pytest per unit, each writing its report into OUT_DIR (kept reports are reused). After
    stopping a pytest, the JIT build locks in EXTENSIONS_DIR (which no other process uses) are stale.
    With ONLY_PASSED_IN (a directory of reports), only the tests that passed there are run."""
    out_dir.mkdir(parents=True, exist_ok=True)
    outcomes, reused = {}, 0
    for number, unit in enumerate(units, 1):
        junit = out_dir / _report_name(unit)
        selection = [unit]
        if only_passed_in and not junit.is_file():
            reference = only_passed_in / _report_name(unit)
            if not reference.is_file():
                raise SystemExit(f"--only-passed-in: {reference} does not exist: run {unit} on the pristine tree "
                                 f"into {only_passed_in} first")
            selection = _passed_node_ids(unit, reference)
            if not selection:
                print(f"== {label}: [{number}/{len(units)}] {unit}: passes no test in {only_passed_in}: not run",
                      flush=True)
                continue
        if junit.is_file():
            reused += 1
        else:
            partial = junit.with_suffix(".partial")
            start = time.monotonic()
            proc = subprocess.Popen([*cmd, f"--junitxml={partial}", *selection], cwd=tests_dir, env=env,
                                    start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, errors="replace")
            # pytest's output goes on to the terminal and is kept: it names the tests that finished
            # if pytest itself cannot write its report
            output = []
            echo = threading.Thread(target=_echo_and_keep, args=(proc.stdout, output), daemon=True)
            echo.start()
            try:
                code = proc.wait(timeout=file_timeout)
            except subprocess.TimeoutExpired:
                code = None
            finally:
                # also when this runner is stopped (SIGTERM from timeout(1) raises SystemExit in main()):
                # pytest runs in a session of its own, which would outlive it
                if proc.poll() is None:
                    os.killpg(proc.pid, 9)
                    proc.wait()
                    for lock in extensions_dir.glob("*/lock") if extensions_dir else ():
                        lock.unlink(missing_ok=True)
            echo.join(timeout=10)
            if not partial.is_file():  # (one that wrote its report and then hung keeps it)
                reason = f"outlived --file-timeout {file_timeout} s" if code is None else f"exited {code}"
                _write_failed_report(partial, unit, f"no report: pytest {reason}", output)
            partial.replace(junit)
            # (a pytest stopped in the middle of a line leaves it open)
            open_line = "\n" if output and not output[-1].endswith("\n") else ""
            print(f"{open_line}== {label}: [{number}/{len(units)}] {unit}: {_summary(_outcomes(junit))} "
                  f"in {time.monotonic() - start:.0f} s", flush=True)
        outcomes.update(_outcomes(junit))
    if reused:
        print(f"== {label}: {reused} of {len(units)} file(s) already had a report in {out_dir}", flush=True)
    return outcomes


def _shard(units, shard):
    k, _, n = (shard or "1/1").partition("/")
    if not (k.isdigit() and n.isdigit() and 1 <= int(k) <= int(n)):
        raise SystemExit(f"--shard must be K/N with 1 <= K <= N, got {shard!r}")
    return units[int(k) - 1::int(n)]


def run(tree, tests, ranks, junit, paths, pytest_args, label=None, by_file=None, shard=None, file_timeout=1800,
        only_passed_in=None):
    """Run upstream's tests in PATHS against TREE; returns ({test id: outcome}, seconds). A PATH is relative
    to tests/, or a path to a file under some other tree's tests/, which then replaces the copy's file."""
    tree = Path(tree).resolve()
    if not (tree / "deepspeed" / "__init__.py").is_file():
        raise SystemExit(f"{tree} is not a DeepSpeed tree (no deepspeed/__init__.py)")
    label = (label or tree.name) + (f"-shard{shard.replace('/', 'of')}" if shard else "")
    scratch = REPO_ROOT / "build" / "upstream-suite" / label
    tests_dir, src, standin = prepare(tree, tests, scratch)
    relative = []
    for path in DEFAULT_PATHS if paths in ([], ["all"]) else paths:
        file_part, _, node = path.partition("::")
        if not Path(file_part).is_absolute() and not (tests_dir / file_part).exists():
            print(f"== {label}: {file_part} is not in these tests (an older snapshot); left out", flush=True)
            continue
        if Path(file_part).is_absolute():
            inside = _test_file_from_elsewhere(Path(file_part))
            if not (tests_dir / inside).is_file() or not (tests_dir / inside).samefile(file_part):
                (tests_dir / inside).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(file_part, tests_dir / inside)
            file_part = str(inside)
        relative.append(file_part + (f"::{node}" if node else ""))
    if not relative:
        raise Skip(f"none of the test paths is in {src}")
    paths = relative
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env["LOCAL_SIZE"] = str(ranks)
    env.setdefault("DS_ACCELERATOR", os.environ.get("ZERO3_TEST_DEVICE", "cpu"))
    extensions_of_this_run = by_file and "TORCH_EXTENSIONS_DIR" not in env
    if extensions_of_this_run:
        # --by-file stops a file's pytest with SIGKILL at its timeout; one stopped while building or
        # loading a JIT op leaves that op's lock behind, and every later test that loads the op waits
        # for it forever. A directory of this run's own can have the locks of a stopped pytest removed.
        env["TORCH_EXTENSIONS_DIR"] = str(REPO_ROOT / "build" / "upstream-suite" / f"torch_extensions-{label}")
    env.setdefault("TORCH_EXTENSIONS_DIR", str(REPO_ROOT / "build" / "upstream-suite" / "torch_extensions"))
    env.setdefault("DS_BUILD_OPS", "0")
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", "--continue-on-collection-errors",
           *pytest_args]
    print(f"== {label}: upstream's tests from {src}{' (stand-in for test_zero_user_backward.py)' if standin else ''}, "
          f"{ranks} rank(s), {env['DS_ACCELERATOR']}: {' '.join(paths)}", flush=True)
    start = time.monotonic()
    if by_file:
        units = _shard(_test_files(tests_dir, paths), shard)
        outcomes = _run_by_file(cmd, tests_dir, env, units, Path(by_file).resolve(), file_timeout, label,
                                Path(env["TORCH_EXTENSIONS_DIR"]) if extensions_of_this_run else None,
                                Path(only_passed_in).resolve() if only_passed_in else None)
        seconds = time.monotonic() - start
        print(f"== {label}: {_summary(outcomes)} in {seconds:.0f} s ({len(units)} file(s))", flush=True)
        return outcomes, seconds
    junit = Path(junit).resolve() if junit else scratch / "junit.xml"
    proc = subprocess.run([*cmd, f"--junitxml={junit}", *paths], cwd=tests_dir, env=env)
    seconds = time.monotonic() - start
    if not junit.is_file():
        raise SystemExit(f"pytest wrote no report (exit {proc.returncode}); see its output above")
    outcomes = _outcomes(junit)
    print(f"== {label}: {_summary(outcomes)} in {seconds:.0f} s", flush=True)
    return outcomes, seconds


def series_test_paths(tree):
    """The test files (test_*.py) under tests/unit that TREE's patch series adds or modifies (git diff from the
    base scripts/apply.sh recorded for the checked-out branch), relative to tests/: the v0.19.8 follow-up puts
    its tests into upstream's own files, so these hold upstream's tests too."""
    def git(*args):
        return subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True).stdout.strip()
    branch = git("symbolic-ref", "-q", "--short", "HEAD")
    base = git("config", "--get", f"branch.{branch}.zero3base") if branch else ""
    if not base:
        raise SystemExit(f"{tree}: no base recorded by scripts/apply.sh for the checked-out branch; "
                         "name the test files to run")
    changed = [p for p in git("diff", "--name-only", "--diff-filter=AM", base, "HEAD", "--", "tests/unit").splitlines()
               if Path(p).name.startswith("test_") and p.endswith(".py")]
    if not changed:
        raise SystemExit(f"{tree}: the series adds or modifies no test file under tests/unit since {base[:12]}")
    return [str(Path(p).relative_to("tests")) for p in changed]


def _summary(outcomes):
    counts = Counter(outcomes.values())
    return ", ".join(f"{counts[o]} {o}" for o in (PASSED, FAILED, SKIPPED))


def compare(pristine, patched):
    """(lines describing every test whose outcome differs, number of regressions)."""
    lines, regressions = [], 0
    for test_id in sorted(set(pristine) | set(patched)):
        before, after = pristine.get(test_id, "missing"), patched.get(test_id, "missing")
        if before == after:
            continue
        regression = before == PASSED and after != PASSED
        regressions += regression
        lines.append(f"  {'REGRESSION ' if regression else ''}{test_id}: {before} -> {after}")
    return lines, regressions


def _results(source):
    """{report name: {test id: outcome}} of a report file or a --by-file directory of them."""
    source = Path(source)
    if source.is_dir():
        reports = sorted(source.glob("*.xml"))
        if not reports:
            raise SystemExit(f"{source} holds no report (*.xml): run `run --by-file {source}` first")
        return {r.name: _outcomes(r) for r in reports}
    if source.is_file():
        return {source.name: _outcomes(source)}
    raise SystemExit(f"{source}: no such report or directory of reports")


def diff(pristine_source, patched_source, brief=False):
    """Compare two results over the reports both hold; returns the exit code. ``brief``: count the changes
    by kind (``missing -> passed``: a test only the patched tree has) instead of naming each one; a
    regression is still named."""
    pristine, patched = _results(pristine_source), _results(patched_source)
    if Path(pristine_source).is_dir() and Path(patched_source).is_dir():
        shared = sorted(set(pristine) & set(patched))
        unpassed = 0
        for role, results in (("pristine", pristine), ("patched", patched)):
            for name in sorted(set(results) - set(shared)):
                # --brief: a file in which pristine passes no test cannot regress; count it, do not name it
                if brief and role == "pristine" and PASSED not in results[name].values():
                    unpassed += 1
                    continue
                print(f"  only the {role} results have {name}: not compared")
        if unpassed:
            print(f"  {unpassed} file(s) in which pristine passes no test: not run on this side")
    else:
        shared = None
    before = {t: o for name, tests in pristine.items() if shared is None or name in shared for t, o in tests.items()}
    after = {t: o for name, tests in patched.items() if shared is None or name in shared for t, o in tests.items()}
    lines, regressions = compare(before, after)
    files = f"{len(shared)} file(s)" if shared is not None else "one report each"
    print(f"compared {files}: pristine {_summary(before)}; patched {_summary(after)}")
    return _print_changes(lines, regressions, brief)


def _print_changes(lines, regressions, brief=False):
    """Print what compare() found, for `compare` and `diff`; returns the exit code."""
    print(f"{len(lines)} test(s) changed outcome" + (":" if lines else ""))
    if brief:
        # "  [REGRESSION ]test id: before -> after": count by "before -> after"
        kinds = Counter(line.rsplit(": ", 1)[1] for line in lines)
        for kind, count in sorted(kinds.items()):
            print(f"  {count} {kind}")
        lines = [line for line in lines if line.startswith("  REGRESSION ")]
    for line in lines:
        print(line)
    print(f"{regressions} regression(s): {'none' if not regressions else 'a test that passes on pristine does not pass patched'}")
    return 1 if regressions else 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    pytest_args = []
    if "--" in argv:
        cut = argv.index("--")
        argv, pytest_args = argv[:cut], argv[cut + 1:]
    parser = argparse.ArgumentParser(prog="python -m tests.upstream_suite", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("diff", help="compare two results of `run` (reports or --by-file directories)")
    p.add_argument("results", nargs=2, metavar="RESULTS")
    p.add_argument("--brief", action="store_true",
                   help="count the changes by kind instead of listing each test (regressions are still listed)")
    for name in ("run", "compare"):
        p = sub.add_parser(name)
        p.add_argument("trees", nargs=1 if name == "run" else 2, metavar="TREE")
        p.add_argument("--tests", help="upstream's tests/ for trees without them: a directory or a snapshot .tgz")
        p.add_argument("--ranks", type=int, default=2, help="LOCAL_SIZE: the most ranks a test may use (default 2)")
        p.add_argument("paths", nargs="*", metavar="PATH", help="test paths relative to tests/")
        if name == "run":
            where = p.add_mutually_exclusive_group()
            where.add_argument("--junit", help="where to write the JUnit XML report")
            where.add_argument("--by-file", metavar="DIR",
                               help="one pytest and one report per test file, in DIR; files with a report are skipped")
            p.add_argument("--shard", metavar="K/N", help="with --by-file: only the K-th of every N test files")
            p.add_argument("--file-timeout", type=int, default=1800, metavar="S",
                           help="with --by-file: seconds a file's pytest may take (default 1800)")
            p.add_argument("--only-passed-in", metavar="PRISTINE_DIR",
                           help="with --by-file: run only the tests that passed in PRISTINE_DIR's reports")
        else:
            p.add_argument("--out", help="directory for both JUnit XML reports (default build/upstream-suite)")
    args = parser.parse_args(argv)
    # timeout(1) and job control stop a run with SIGTERM: exit through Python so that the pytest of the
    # file being run, in a session of its own, is stopped too (_run_by_file)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        if args.command == "diff":
            return diff(*args.results, brief=args.brief)
        if args.command == "run":
            if (args.shard or args.only_passed_in) and not args.by_file:
                parser.error(f"{'--shard' if args.shard else '--only-passed-in'} needs --by-file")
            outcomes, _ = run(args.trees[0], args.tests, args.ranks, args.junit, args.paths, pytest_args,
                              by_file=args.by_file, shard=args.shard, file_timeout=args.file_timeout,
                              only_passed_in=args.only_passed_in)
            return 1 if FAILED in outcomes.values() else 0
        out = Path(args.out or REPO_ROOT / "build" / "upstream-suite")
        out.mkdir(parents=True, exist_ok=True)
        results = []
        for role, tree in zip(("pristine", "patched"), args.trees):
            label = f"{role}-{Path(tree).resolve().name}"
            results.append(run(tree, args.tests, args.ranks, out / f"{label}.xml", args.paths, pytest_args, label))
        if not any(outcome == PASSED for outcome in results[0][0].values()):
            # a comparison in which nothing ran proves nothing (a missing requirement, a broken tree)
            print(f"no test passed on the pristine tree {args.trees[0]}: upstream's tests did not run (see above)")
            return 1
        lines, regressions = compare(results[0][0], results[1][0])
        print(f"\nupstream's tests, {args.ranks} rank(s) at most, {' '.join(args.paths or DEFAULT_PATHS)}:")
        for role, tree, (outcomes, seconds) in zip(("pristine", "patched"), args.trees, results):
            print(f"  {role:8} {tree}: {_summary(outcomes)} ({seconds:.0f} s)")
        return _print_changes(lines, regressions)
    except Skip as reason:
        print(f"skipped: {reason}")
        return 0


if __name__ == "__main__":
    sys.exit(main())
