"""Run a DeepSpeed tree's tests/unit/v1/zero/ tests with this project's stand-in for upstream's harness.

    python -m tests.upstream_compat.run <deepspeed-tree> [pytest args and test paths]

<deepspeed-tree> is an sdist-based tree (deepspeed/ plus the test files the patch series adds under
tests/unit/). As upstream's tests/conftest.py does, the tree goes first on sys.path, so the ranks run the
tree's deepspeed package, not an installed one. Test paths may be given relative to the tree or to the
current directory (the tree wins); without any, tests/unit/v1/zero/ runs. A tree that has upstream's own
tests/unit/common.py (a v0.19.8 tree from apply.sh, a git checkout, a fork) keeps upstream's `unit` package
instead of the stand-in (its DistributedTest classes run the same way), and without test paths the test
files its series adds or modifies run (tests/upstream_suite.py runs upstream's suite with upstream's own harness).
When such a tree lacks unit/v1/zero/test_zero_user_backward.py (upstream's master snapshot leaves it out; the
lifecycle tests import it), its tests run from a scratch copy under build/upstream-compat/ (one per run,
removed when it ends) with
tests/upstream_compat/standins/user_backward.py in that place; the tree itself is not written to.
ZERO3_TEST_DEVICE=cuda runs on GPUs (NCCL). The exit status is pytest's.
"""

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
COMPAT_DIR = Path(__file__).resolve().parent
DEFAULT_TESTS = Path("tests") / "unit" / "v1" / "zero"


def _split(tree, args):
    """Separate test paths (made absolute; relative ones are looked up in the tree first) from other arguments."""
    paths, others = [], []
    for arg in args:
        path_part = arg.split("::", 1)[0]
        if not arg.startswith("-") and path_part:
            for base in (tree, Path.cwd()):
                if (base / path_part).exists():
                    paths.append(str((base / path_part).resolve()) + arg[len(path_part):])
                    break
            else:
                others.append(arg)
        else:
            others.append(arg)
    return paths, others


def _moved(path, old_dir, new_dir):
    """PATH (a file, maybe with ::node) under OLD_DIR, as the same place under NEW_DIR; other paths as they are."""
    file_part, sep, node = path.partition("::")
    if not Path(file_part).is_relative_to(old_dir):
        return path
    return str(new_dir / Path(file_part).relative_to(old_dir)) + sep + node


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    tree = Path(argv[0]).resolve()
    # A tree with upstream's own tests/ (a v0.19.8 tree from apply.sh, a clone, a fork) has upstream's `unit`
    # package, whose DistributedTest classes the plugin runs the same way; the stand-in is for trees without it.
    upstream_unit = (tree / "tests" / "unit" / "common.py").exists()
    if not (tree / "deepspeed").is_dir():
        print(f"warning: {tree} has no deepspeed/ package; the installed deepspeed will be tested", file=sys.stderr)
    paths, others = _split(tree, argv[1:])
    if not paths and upstream_unit:
        from tests.upstream_suite import series_test_paths
        paths = [str(tree / "tests" / p) for p in series_test_paths(tree)]
    tests_dir = tree / "tests"
    if upstream_unit and not (tests_dir / "unit" / "v1" / "zero" / "test_zero_user_backward.py").exists():
        from tests.upstream_suite import prepare
        # one scratch copy per run: runs of the same tree at once (one per GPU) must not share it
        parent = REPO_ROOT / "build" / "upstream-compat"
        parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=f"{tree.name}-", dir=parent))
        atexit.register(shutil.rmtree, scratch, ignore_errors=True)
        tests_dir = prepare(tree, None, scratch)[0]
        paths = [_moved(p, tree / "tests", tests_dir) for p in paths]
    if not paths:
        if not (tree / DEFAULT_TESTS).is_dir():
            print(f"{tree / DEFAULT_TESTS} does not exist and no test path was given", file=sys.stderr)
            return 2
        paths = [str(tree / DEFAULT_TESTS)]

    from tests.harness.pool import default_device
    os.environ.setdefault("DS_ACCELERATOR", default_device())
    # Order matters: this repository first ("tests" must be ours: the ranks run tests.harness.worker), then the
    # stand-in "unit" package, then the tree's deepspeed. PYTHONPATH carries the same order to the ranks.
    # (upstream's tests import `unit` from tests/, which its conftest.py, not loaded here, puts on sys.path)
    entries = [str(REPO_ROOT), str(tests_dir if upstream_unit else COMPAT_DIR)] + (
        [str(tree)] if (tree / "deepspeed").is_dir() else [])
    sys.path[:0] = [e for e in entries if e not in sys.path]
    old = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in entries]
    os.environ["PYTHONPATH"] = os.pathsep.join(entries + old)

    import pytest
    args = [
        "-p", "tests.upstream_compat.plugin",
        # The tree's own conftest files (none in an sdist tree) are upstream's, not ours, and this repository's
        # pytest.ini must not apply either.
        "--noconftest", "-c", os.devnull, "--rootdir", str(tests_dir), "-p", "no:cacheprovider",
    ] + others + paths
    return pytest.main(args)


if __name__ == "__main__":
    sys.exit(main())
