#!/usr/bin/env python3
"""Prove that each batch of a series (patches/VERSION/batches: one pull request each) is safe alone.

    python scripts/prove_batches.py VERSION [--keep]

For every batch: it applies alone on the pristine release with `git am`; the test files it adds all
pass on that tree, and each of them fails on the pristine release (else it proves nothing); and every
test of the whole series' test files that passes on the pristine release still passes with the batch
alone (a batch must not make another batch's case worse before that batch is merged). The whole series
passes all of them. Tests run with tests/upstream_compat/run.py (the tree's deepspeed first on
sys.path; nothing is installed). Trees go to build/batches-VERSION/ (removed at the end unless --keep).
Exit 0 when every check holds, 1 when one does not (all batches are tried), 2 on bad usage.
"""

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from tests.upstream_suite import PASSED, _outcomes  # noqa: E402  (the JUnit reading the suite comparison uses)


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


def added_tests(tree, base):
    out = sh("git", "-C", tree, "diff", "--name-only", "--diff-filter=A", base, "HEAD", "--", "tests/unit").stdout
    return [tree / p for p in out.split() if p.endswith(".py")]


def run_tests(tree, files, junit, source):
    """{test id: outcome} of FILES (test files of the tree SOURCE) run against TREE's deepspeed. They are
    copied into TREE first (a throwaway tree), so that pytest names their tests as in SOURCE."""
    local = []
    for f in files:
        dest = tree / f.relative_to(source)
        if dest.resolve() != f.resolve():
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, dest)
        local.append(dest)
    proc = sh(sys.executable, "-m", "tests.upstream_compat.run", tree, *local, "-q", f"--junitxml={junit}", cwd=REPO,
              check=False)
    if not junit.is_file():
        sys.exit(f"no test report for {tree}:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    # keyed "test_file.TestClass::test": the same test in two trees' copies of a file has one key
    return {".".join(test_id.split("::")[0].split(".")[-2:]) + "::" + test_id.split("::", 1)[-1]: outcome
            for test_id, outcome in _outcomes(junit).items()}


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
    sh("bash", REPO / "scripts" / "apply.sh", args.version, "--pristine", "--dest", pristine)
    sh("bash", REPO / "scripts" / "apply.sh", args.version, "--dest", full)
    base = sh("git", "-C", pristine, "rev-parse", "HEAD").stdout.strip()
    all_tests = added_tests(full, base)
    print(f"{args.version}: {len(all_tests)} test files added by the series; base {base[:12]}", flush=True)

    pristine_run = work / "pristine-run"
    if pristine_run.exists():
        shutil.rmtree(pristine_run)
    sh("git", "clone", "--quiet", "--shared", pristine, pristine_run)
    before = run_tests(pristine_run, all_tests, work / "pristine.xml", full)
    after = run_tests(full, all_tests, work / "full.xml", full)
    failures = [t for t, o in after.items() if o != PASSED]
    ok = not failures
    print(f"whole series: {sum(o == PASSED for o in after.values())}/{len(after)} tests pass"
          + (f"; NOT passing: {', '.join(failures)}" if failures else ""))
    print(f"pristine {args.version}: {sum(o == PASSED for o in before.values())}/{len(before)} pass")

    for name, patches in batches_of(patch_dir).items():
        tree = work / f"batch-{name}"
        if tree.exists():
            shutil.rmtree(tree)
        sh("git", "clone", "--quiet", "--shared", pristine, tree)
        applied = True
        for patch in patches:
            text = sh("awk", "-v", "from=From: prove <prove@localhost>", "-f", REPO / "scripts" / "patch-author.awk",
                      patch_dir / patch).stdout
            if sh("git", "-C", tree, "-c", "user.name=prove", "-c", "user.email=prove@localhost", "am", "--quiet",
                  stdin=text, check=False).returncode != 0:
                print(f"batch {name}: {patch} does NOT apply alone on {args.version}")
                applied = ok = False
                break
        if not applied:
            continue
        own = added_tests(tree, base)
        outcomes = run_tests(tree, all_tests, work / f"batch-{name}.xml", full)
        own_ids = {t for t in outcomes if t.split(".")[0] in {f.stem for f in own}}
        own_failing = sorted(t for t in own_ids if outcomes[t] != PASSED)
        proves_nothing = sorted(f.name for f in own
                                if not any(before.get(t) != PASSED for t in own_ids if t.startswith(f.stem + ".")))
        worse = sorted(t for t, o in before.items() if o == PASSED and outcomes.get(t) != PASSED)
        ok = ok and not (own_failing or proves_nothing or worse)
        print(f"batch {name} ({len(patches)} patches) applies alone: its {len(own_ids)} tests "
              f"{'all pass' if not own_failing else 'do NOT all pass: ' + ', '.join(own_failing)}; "
              f"{'each of its ' + str(len(own)) + ' files fails on pristine' if not proves_nothing else 'passing on pristine already: ' + ', '.join(proves_nothing)}; "
              f"{'no test of the series passing on pristine fails with it' if not worse else 'WORSE than pristine: ' + ', '.join(worse)}",
              flush=True)
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
