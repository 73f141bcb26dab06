#!/usr/bin/env python3
"""Prove that each batch of a series (patches/VERSION/batches: one pull request each) is safe alone.

    python scripts/prove_batches.py VERSION [--keep]

The series' test files are the test files under tests/unit that the whole series adds or modifies. For the
v0.19.8 follow-up those are upstream's own files (unit/v1/zero/test_zero_activation_checkpoint_lifecycle.py and
unit/runtime/zero/test_zero_leaf_module.py), so every run below also runs upstream's own tests of those files,
at world size 1 and 2 (LOCAL_SIZE=2), and the output says how many of them there are. A batch's own tests are
the tests of its tree's version of those files that pristine's version lacks, and the tests already in
pristine's version whose source (the test function with its decorators, and its class's decorators and
attributes) the batch changes.

For every batch: it applies alone on the pristine release with `git am` (no 3-way merge); its own tests all
pass on that tree, and each of them fails on the pristine release (else it proves nothing); and every test of
the whole series' files that passes on the pristine release still passes with the batch alone (upstream's
tests included: a batch must not make another batch's case, or upstream's, worse before that batch is merged).
The whole series passes every test of its files that passed on the pristine release, its own new and changed
tests included, and fails none. This covers what tox -e upstream-v0198 checks in CI with those two files
(pristine's version of them on the pristine release against the series' version with the series): a test of
pristine's version either is unchanged in the series' version, and must then pass with the series if it
passed on pristine, or is one the series changes, and must then pass with the series.

The series' version of the files (the whole series' tree) is what runs everywhere: on the pristine release,
with the whole series, and with each batch, where only the batch's own tests and the tests that pass on the
pristine release run (the others fail there and are another batch's). Tests run with
tests/upstream_compat/run.py (the tree's deepspeed first on sys.path, upstream's tests/unit harness classes,
this project's rank pool; nothing is installed). Each batch's reproduction script (patches/VERSION/repro/)
must fail on the release and pass with the batch. Trees go to build/batches-VERSION/ (removed at the end
unless --keep). Exit 0 when every check holds, 1 when one does not (all batches are tried), 2 on bad usage.
"""

import argparse
import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from tests.upstream_suite import FAILED, PASSED, _outcomes  # noqa: E402  (the JUnit reading the suite comparison uses)


def sh(*cmd, cwd=None, stdin=None, check=True):
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, input=stdin, capture_output=True, text=True)
    if check and proc.returncode != 0:
        sys.exit(f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return proc


def batches_of(patch_dir):
    names = [line.strip() for line in (patch_dir / "series").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    batches = {}
    for line in (patch_dir / "batches").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, *numbers = line.split()
            batches[name] = [next(n for n in names if n.startswith(number + "-")) for number in numbers]
    return batches


def am(tree, patch):
    """git am PATCH in TREE without a 3-way merge, as "prove" when the patch names no author (the committed
    patches name none), committed at the patch's own date: the same patches on the same base give the same
    commit ids. False, and the am aborted, when it does not apply."""
    text = sh("awk", "-v", "from=From: prove <prove@localhost>", "-f", REPO / "scripts" / "patch-author.awk",
              patch).stdout
    if sh("git", "-C", tree, "-c", "user.name=prove", "-c", "user.email=prove@localhost", "am", "--quiet",
          "--no-3way", "--committer-date-is-author-date", stdin=text, check=False).returncode == 0:
        return True
    sh("git", "-C", tree, "am", "--abort", check=False)
    return False


def series_test_files(tree, base):
    """The test files (test_*.py) under tests/unit that base..HEAD of TREE adds or modifies, relative to TREE."""
    out = sh("git", "-C", tree, "diff", "--name-only", "--diff-filter=AM", base, "HEAD", "--", "tests/unit").stdout
    return [Path(p) for p in out.split() if Path(p).name.startswith("test_") and p.endswith(".py")]


def test_sources(text, stem):
    """{"STEM::Class::test" or "STEM::test": source} of the tests in the file TEXT. A method's source takes in
    its class's decorators and attributes, which change what it runs just as its own lines do."""
    lines = text.splitlines()

    def source(node):
        start = min([d.lineno for d in getattr(node, "decorator_list", [])] + [node.lineno])
        return "\n".join(lines[start - 1:node.end_lineno])

    tests = {}
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
            tests[f"{stem}::{node.name}"] = source(node)
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            shared = "\n".join([ast.get_source_segment(text, d) for d in node.decorator_list] +
                               [source(n) for n in node.body if not isinstance(n, ast.FunctionDef)])
            for method in node.body:
                if isinstance(method, ast.FunctionDef) and method.name.startswith("test"):
                    tests[f"{stem}::{node.name}::{method.name}"] = shared + "\n" + source(method)
    return tests


def own_tests(files, tree, pristine_texts):
    """The keys of test_sources() that TREE's version of FILES adds to, or changes in, pristine's."""
    own = set()
    for f in files:
        path = tree / f
        mine = test_sources(path.read_text(), f.stem) if path.is_file() else {}
        theirs = test_sources(pristine_texts[f], f.stem) if pristine_texts[f] is not None else {}
        own |= {key for key, text in mine.items() if theirs.get(key) != text}
    return own


def function_of(test_id):
    """The test_sources() key of a run's test id ("STEM::Class::test[params]")."""
    return test_id.split("[", 1)[0]


def run_tests(tree, files, source, junit, only=None):
    """{"STEM::Class::test[params]": outcome} of FILES (relative paths, SOURCE's version) run against TREE's
    deepspeed: they are copied into TREE first (a throwaway tree). ONLY (test ids) runs those tests alone."""
    for f in files:
        if (tree / f).resolve() != (source / f).resolve():
            (tree / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source / f, tree / f)
    if only is not None:
        by_stem = {f.stem: f for f in files}
        targets = []
        for test_id in sorted(only):
            stem, rest = test_id.split("::", 1)
            targets.append(f"{tree / by_stem[stem]}::{rest}")
    else:
        targets = [tree / f for f in files]
    # LOCAL_SIZE=2: what upstream's CPU accelerator reads as the rank count, as in tests/upstream_suite.py
    env = dict(os.environ, LOCAL_SIZE=os.environ.get("LOCAL_SIZE", "2"))
    proc = subprocess.run([sys.executable, "-m", "tests.upstream_compat.run", tree, *targets, "-q",
                           f"--junitxml={junit}"], cwd=REPO, env=env, capture_output=True, text=True)
    if not junit.is_file():
        sys.exit(f"no test report for {tree}:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    outcomes = {}
    for test_id, outcome in _outcomes(junit).items():
        # "unit.v1.zero.test_x.TestY::test_z[p]" or "unit.v1.zero.test_x::test_z[p]" (a module-level test)
        classname, _, name = test_id.partition("::")
        parts = classname.split(".")
        at = next((i for i, p in enumerate(parts) if p.startswith("test_")), len(parts) - 1)
        outcomes["::".join([parts[at], *parts[at + 1:], name])] = outcome
    return outcomes


def run_repro(script, tree, port):
    """(exit status, last line of output) of a batch's reproduction script on TREE, one process, world size 1."""
    env = dict(os.environ, PYTHONPATH=str(tree), RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(port))
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
    errors = [line for line in (proc.stdout + proc.stderr).splitlines() if "Error" in line]
    return proc.returncode, (errors or ["no error"])[-1].strip()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("version")
    parser.add_argument("--keep", action="store_true", help="keep the trees under build/batches-VERSION/")
    args = parser.parse_args()
    patch_dir = REPO / "patches" / args.version
    if not (patch_dir / "batches").is_file():
        parser.error(f"{patch_dir}/batches does not exist")
    work = REPO / "build" / f"batches-{args.version}"
    pristine, full = work / "pristine", work / "full"
    for options in (["--pristine", "--dest", pristine], ["--dest", full]):
        apply = ["bash", REPO / "scripts" / "apply.sh", args.version, *options]
        # exit 5: a tree an earlier run (--keep) made with another patch set, this script's own to replace
        if sh(*apply, check=False).returncode == 5:
            sh(*apply, "--force")
    base = sh("git", "-C", pristine, "rev-parse", "HEAD").stdout.strip()
    files = series_test_files(full, base)
    pristine_texts = {f: (pristine / f).read_text() if (pristine / f).is_file() else None for f in files}
    series_own = own_tests(files, full, pristine_texts)
    removed = sorted(key for f in files if pristine_texts[f] is not None
                     for key in set(test_sources(pristine_texts[f], f.stem)) - set(test_sources((full / f).read_text(), f.stem)))
    print(f"{args.version}: base {base[:12]}; the series' tests are in {len(files)} files it adds or modifies: "
          f"{', '.join(str(f) for f in files)}", flush=True)

    pristine_run = work / "pristine-run"
    if pristine_run.exists():
        shutil.rmtree(pristine_run)
    sh("git", "clone", "--quiet", "--shared", pristine, pristine_run)
    after = run_tests(full, files, full, work / "full.xml")
    before = run_tests(pristine_run, files, full, work / "pristine.xml")
    upstream_ids = {t for t in after if function_of(t) not in series_own}
    print(f"these files hold {len(after)} tests: {len(after) - len(upstream_ids)} the series adds or changes, and "
          f"{len(upstream_ids)} of upstream's own, which run with every tree below too (world size 1 and 2, "
          f"LOCAL_SIZE=2): {sum(before.get(t) == PASSED for t in upstream_ids)} pass on pristine {args.version}",
          flush=True)
    failures = sorted(t for t, o in after.items()
                      if o == FAILED or (function_of(t) in series_own and o != PASSED)
                      or (before.get(t) == PASSED and o != PASSED))
    failures += [f"{key} (removed by the series)" for key in removed]
    ok = not failures
    skipped = sorted(t for t, o in after.items() if o != PASSED and t not in failures)
    print(f"whole series: {sum(o == PASSED for o in after.values())}/{len(after)} tests pass"
          + (f", {len(skipped)} skipped or xfailed as on pristine" if skipped else "")
          + (f"; NOT passing: {', '.join(failures)}" if failures else ""), flush=True)
    print(f"pristine {args.version}: {sum(o == PASSED for o in before.values())}/{len(before)} pass")
    passing_on_pristine = {t for t, o in before.items() if o == PASSED}

    for name, patches in batches_of(patch_dir).items():
        tree = work / f"batch-{name}"
        if tree.exists():
            shutil.rmtree(tree)
        sh("git", "clone", "--quiet", "--shared", pristine, tree)
        failing = next((patch for patch in patches if not am(tree, patch_dir / patch)), None)
        if failing:
            print(f"batch {name}: {failing} does NOT apply alone on {args.version}")
            ok = False
            continue
        own = own_tests(files, tree, pristine_texts)
        own_ids = {t for t in after if function_of(t) in own}
        outcomes = run_tests(tree, files, full, work / f"batch-{name}.xml", only=own_ids | passing_on_pristine)
        own_failing = sorted(t for t in own_ids if outcomes.get(t) != PASSED)
        proves_nothing = sorted(t for t in own_ids if before.get(t) != FAILED)
        worse = sorted(t for t in passing_on_pristine if outcomes.get(t) != PASSED)
        upstream_kept = len(passing_on_pristine & upstream_ids) - len(set(worse) & upstream_ids)
        ok = ok and not (own_failing or proves_nothing or worse)
        print(f"batch {name} ({len(patches)} patches) applies alone: its {len(own_ids)} tests "
              f"{'all pass' if not own_failing else 'do NOT all pass: ' + ', '.join(own_failing)}; "
              f"{'each fails on pristine' if not proves_nothing else 'NOT failing on pristine: ' + ', '.join(proves_nothing)}; "
              f"{'no test passing on pristine fails with it' if not worse else 'WORSE than pristine: ' + ', '.join(worse)} "
              f"({upstream_kept} of upstream's own still pass)", flush=True)
        repro = patch_dir / "repro" / f"{name}.py"
        if repro.is_file():
            # the reproduction in the batch's cover letter: it must fail on the release and pass with the batch
            (on_pristine, error), (with_batch, after_error) = (run_repro(repro, t, 29700 + i)
                                                               for i, t in enumerate((pristine, tree)))
            fine = on_pristine != 0 and with_batch == 0
            ok = ok and fine
            print(f"batch {name}: repro/{repro.name} {'fails' if on_pristine else 'does NOT fail'} on {args.version} "
                  f"({error}) and {'passes' if not with_batch else 'FAILS (' + after_error + ')'} with the batch")
        if not args.keep:
            shutil.rmtree(tree)
    print("every batch is safe alone" if ok else "a batch is NOT safe alone (above)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
