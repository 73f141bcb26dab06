"""`scripts/apply.sh VERSION --onto BRANCH`, the fork workflow (docs/guide/forks.md), on real git repos.

A fork here is what a platform team has: a clone of a pristine DeepSpeed release (apply.sh --pristine from
the sha256-checked sdist, for v0.19.2 with upstream's tests/ snapshot) that has never seen the series' blobs,
plus one commit of its own on branch `internal` touching parameter_offload.py and the coordinator. Two such
commits: one next to the series' changes (it must merge with no hand work) and one on a line the series
changes too (an ordinary conflict, stopped where git stops, with the resume and abort commands printed).
v0.19.2 is pinned by upstream commit and sdist; v0.19.1 by its sdist alone (its series is a port).
"""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.sdists import index_disabled, local_sdist, sdist_name

REPO = Path(__file__).resolve().parents[1]
APPLY = REPO / "scripts" / "apply.sh"
E_VERIFY, E_CHECKOUT, E_CONFLICT = 8, 6, 11
COORD = "deepspeed/runtime/zero/partitioned_param_coordinator.py"
OFFLOAD = "deepspeed/runtime/zero/parameter_offload.py"
FORK_IDENTITY = {"GIT_AUTHOR_NAME": "Fork Maintainer", "GIT_AUTHOR_EMAIL": "fork@example.invalid",
                 "GIT_COMMITTER_NAME": "Fork Maintainer", "GIT_COMMITTER_EMAIL": "fork@example.invalid"}
# A fork's own counter of releases, in a place no patch of the series changes (so it merges), and the
# same counter on the signature line of release_sub_module, which 0005 rewrites (so it conflicts).
RELEASE_DEF = "    def release_sub_module(self, submodule: Module, forward=False) -> None:\n"
PREFETCH_NVME = "        if not self.is_complete_trace():\n            return\n\n        numel_in_flight"
OFFLOAD_TAIL = "\n\ndef fork_release_calls(offload):\n    return offload.get_param_coordinator().fork_release_calls\n"


def env(**extra):
    scrubbed = ("DEEPSPEED_SDIST", "ZERO3_PINNED_BASES", "GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE")
    e = {k: v for k, v in os.environ.items() if k not in scrubbed}
    e.setdefault("ZERO3_UPSTREAM_TESTS", str(REPO.parent / "shared" / "upstream-tests"))
    # no clone of GitHub: the sdist is the source of the base here
    e["DEEPSPEED_GIT_URL"] = "/nonexistent/DeepSpeed.git"
    e.update(extra)
    return e


def run(cmd, cwd=None, extra_env=None, check=False):
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env(**(extra_env or {})), capture_output=True,
                          text=True, timeout=600)
    if check and proc.returncode:
        raise AssertionError(f"{cmd} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def git(repo, *args, **kw):
    return run(["git", "-C", repo, *args], extra_env={**FORK_IDENTITY, "GIT_EDITOR": "true"}, check=True,
               **kw).stdout.strip()


@pytest.fixture(scope="session")
def sdists(tmp_path_factory):
    """VERSION -> its sdist file: local (ZERO3_TEST_SDIST, DEEPSPEED_SDIST, PIP_FIND_LINKS), else pip download."""
    found = {}

    def get(version):
        if version in found:
            return found[version]
        path = local_sdist(version)
        if path is None:
            if index_disabled():
                pytest.skip(f"{sdist_name(version)} is not local and PIP_NO_INDEX forbids downloading it")
            dest = tmp_path_factory.mktemp("sdist")
            proc = run(["python3", "-m", "pip", "download", "--timeout", "30", "--retries", "1", "--no-deps",
                        "--no-binary", ":all:", f"deepspeed=={version.lstrip('v')}", "-d", dest])
            path = dest / sdist_name(version)
            if proc.returncode or not path.is_file():
                pytest.skip(f"{sdist_name(version)} is not local and pip download failed: "
                            f"{(proc.stderr.strip().splitlines() or ['no output'])[-1]}")
        found[version] = path
        return path

    return get


@pytest.fixture(scope="session")
def pristine(tmp_path_factory, sdists):
    """VERSION -> a pristine tree apply.sh made from the sdist (copy it, never change it)."""
    made = {}

    def get(version):
        if version not in made:
            dest = tmp_path_factory.mktemp("pristine") / version
            run(["bash", APPLY, version, "--pristine", "--sdist", sdists(version), "--dest", dest], check=True)
            made[version] = dest
        return made[version]

    return get


def make_fork(tmp_path, upstream, overlapping):
    """A clone of the pristine release with one commit of its own on branch `internal`, checked out."""
    fork = tmp_path / "fork"
    run(["git", "clone", "-q", "--no-tags", upstream, fork], check=True)
    git(fork, "switch", "-q", "-c", "internal")
    coord, offload = fork / COORD, fork / OFFLOAD
    text = coord.read_text()
    assert RELEASE_DEF in text and PREFETCH_NVME in text
    if overlapping:
        text = text.replace(RELEASE_DEF, RELEASE_DEF.replace("forward=False", "forward=False, fork_tag=None"), 1)
    else:
        text = text.replace(PREFETCH_NVME, PREFETCH_NVME.replace(
            "            return\n", "            return\n        self.fork_release_calls = getattr(self, "
            "'fork_release_calls', 0) + 1\n", 1), 1)
    coord.write_text(text)
    offload.write_text(offload.read_text() + OFFLOAD_TAIL)
    git(fork, "commit", "-q", "-am", "internal: count releases for our dashboards")
    return fork


def no_operation_in_progress(repo):
    for name in ("rebase-apply", "rebase-merge", "MERGE_HEAD", "CHERRY_PICK_HEAD", "sequencer"):
        assert not Path(git(repo, "rev-parse", "--path-format=absolute", "--git-path", name)).exists(), name
    assert git(repo, "status", "--porcelain", "--untracked-files=no") == ""


def series_subjects(version, directory=None):
    directory = directory or REPO / "patches" / version
    out = []
    for name in (directory / "series").read_text().split():
        text = (directory / name).read_text()
        m = re.search(r"^Subject: \[PATCH[^\]]*\] (.*(?:\n .*)*)", text, re.M)
        out.append(" ".join(m.group(1).split()))
    return out


# v0.19.2: pinned by upstream commit and sdist; v0.19.1: by its sdist alone, its series ported from v0.19.2
BASES = ["v0.19.2", "v0.19.1"]


@pytest.mark.parametrize("version", BASES)
def test_fork_commit_next_to_the_series_merges_with_no_hand_work(tmp_path, pristine, sdists, version):
    fork = make_fork(tmp_path, pristine(version), overlapping=False)
    own = git(fork, "rev-parse", "HEAD")
    # the clone lacks the blobs the patches were made against: git am --3way could not fall back here
    proc = run(["bash", APPLY, version, "--onto", "internal", "--sdist", sdists(version)], cwd=fork)
    assert proc.returncode == 0, proc.stderr
    subjects = series_subjects(version)
    assert git(fork, "log", "--reverse", "--format=%s", f"{own}..internal").splitlines() == subjects
    # the fork's own commit is kept, below the series, and its lines are in the result
    assert git(fork, "merge-base", "--is-ancestor", own, "internal") == ""
    assert "fork_release_calls" in (fork / COORD).read_text() and (fork / OFFLOAD).read_text().endswith(OFFLOAD_TAIL)
    no_operation_in_progress(fork)
    # the result is the patched release plus the fork's change, file for file
    patched = tmp_path / "patched"
    run(["bash", APPLY, version, "--sdist", sdists(version), "--dest", patched], check=True)
    own_change = git(fork, "format-patch", "-1", "--stdout", own) + "\n"
    subprocess.run(["git", "-C", str(patched), "apply", "-"], input=own_change, text=True, check=True)
    for path in (COORD, OFFLOAD):
        assert (fork / path).read_text() == (patched / path).read_text(), path
    assert f"undo:    git -C {fork} reset --keep {own[:7]}" in proc.stdout
    # the start of the series is recorded, so that `python -m tests.upstream_compat.run FORK` finds the test files
    # the series adds (and apply.sh still never takes the branch for one of its own)
    assert git(fork, "config", "--get", "branch.internal.zero3base") == own
    assert run(["git", "-C", fork, "config", "--get", "branch.internal.zero3version"]).returncode == 1
    from tests.upstream_suite import series_test_paths
    added = {line[len("+++ b/tests/"):] for name in (REPO / "patches" / version / "series").read_text().split()
             for line in (REPO / "patches" / version / name).read_text().splitlines()
             if line.startswith("+++ b/tests/unit/") and Path(line).name.startswith("test_")}
    assert set(series_test_paths(fork)) == added
    # run again: nothing to add
    again = run(["bash", APPLY, version, "--onto", "internal", "--sdist", sdists(version)], cwd=fork)
    assert again.returncode == 0 and "already applied" in again.stdout, again.stderr


@pytest.mark.parametrize("version", BASES)
def test_fork_commit_on_the_series_lines_stops_at_a_normal_conflict(tmp_path, pristine, sdists, version):
    fork = make_fork(tmp_path, pristine(version), overlapping=True)
    own = git(fork, "rev-parse", "HEAD")
    git(fork, "switch", "-q", "--detach")  # apply.sh switches to the branch it brings the series onto
    proc = run(["bash", APPLY, version, "--onto", "internal", "--sdist", sdists(version)], cwd=fork)
    assert proc.returncode == E_CONFLICT, proc.stderr
    subjects = series_subjects(version)
    stopped = subjects.index("ZeRO-3: keep frozen params gathered across a checkpoint recompute")
    assert f'patch {stopped + 1} of {len(subjects)} to bring, "{subjects[stopped]}", conflicts with branch ' \
           f"internal in: {COORD}" in proc.stderr
    assert f"git -C {fork} add {COORD}" in proc.stderr
    assert f"git -C {fork} cherry-pick --continue" in proc.stderr
    assert f"git -C {fork} cherry-pick --abort" in proc.stderr
    # what the message says is what git says: a cherry-pick stopped at that patch, the ones before it applied
    assert "Cherry-pick currently in progress." in git(fork, "status")
    assert git(fork, "log", "-1", "--format=%s", "CHERRY_PICK_HEAD") == subjects[stopped]
    assert git(fork, "log", "--reverse", "--format=%s", f"{own}..HEAD").splitlines() == subjects[:stopped]
    assert f"{stopped} patch(es) before it are on internal" in proc.stderr

    # the printed abort returns the branch to the fork's commit, with no operation left
    git(fork, "cherry-pick", "--abort")
    assert git(fork, "rev-parse", "internal") == own
    no_operation_in_progress(fork)

    # the printed resume: resolve each conflict (here: the series' side), continue, run apply.sh again
    proc = run(["bash", APPLY, version, "--onto", "internal", "--sdist", sdists(version)], cwd=fork)
    assert proc.returncode == E_CONFLICT
    for _ in range(len(subjects)):
        conflicted = git(fork, "diff", "--name-only", "--diff-filter=U").split()
        if not conflicted:
            break
        git(fork, "checkout", "--theirs", "--", *conflicted)
        git(fork, "add", *conflicted)
        proc = run(["git", "-C", fork, "cherry-pick", "--continue"], extra_env={**FORK_IDENTITY, "GIT_EDITOR": "true"})
    assert proc.returncode == 0, proc.stderr
    no_operation_in_progress(fork)
    again = run(["bash", APPLY, version, "--onto", "internal", "--sdist", sdists(version)], cwd=fork)
    assert again.returncode == 0 and "already applied" in again.stdout, again.stderr
    assert git(fork, "log", "--reverse", "--format=%s", f"{own}..internal").splitlines() == subjects


def test_fork_on_a_release_between_the_fix_and_v0_19_8_takes_the_follow_up(tmp_path, pristine, sdists):
    """v0.19.3 to v0.19.7 have upstream's fix and no series directory of their own: apply.sh puts the v0.19.8
    follow-up's units together for the release (each as it is or by its port, as the committed table records)
    and --onto brings them onto the fork's branch like any series."""
    version = "v0.19.6"  # three units as they are and one ported
    fork = tmp_path / "fork"
    run(["git", "clone", "-q", "--no-tags", pristine(version), fork], check=True)
    git(fork, "switch", "-q", "-c", "internal")
    (fork / OFFLOAD).write_text((fork / OFFLOAD).read_text() + OFFLOAD_TAIL)
    git(fork, "commit", "-q", "-am", "internal: a helper for our dashboards")
    own = git(fork, "rev-parse", "HEAD")
    proc = run(["bash", APPLY, version, "--onto", "internal", "--sdist", sdists(version)], cwd=fork)
    assert proc.returncode == 0, proc.stderr
    put_together = REPO / "build" / "followup-series" / version
    subjects = series_subjects(version, put_together)
    assert len(subjects) == len((REPO / "patches" / "v0.19.8" / "series").read_text().split())
    assert git(fork, "log", "--reverse", "--format=%s", f"{own}..internal").splitlines() == subjects
    no_operation_in_progress(fork)
    # the result is the release built with the same units plus the fork's change, file for file
    patched = tmp_path / "patched"
    run(["bash", APPLY, version, "--sdist", sdists(version), "--dest", patched], check=True)
    own_change = git(fork, "format-patch", "-1", "--stdout", own) + "\n"
    subprocess.run(["git", "-C", str(patched), "apply", "-"], input=own_change, text=True, check=True)
    for path in (COORD, OFFLOAD, "deepspeed/runtime/zero/stage3.py"):
        assert (fork / path).read_text() == (patched / path).read_text(), path


def test_onto_refuses_what_it_cannot_do_safely(tmp_path, pristine, sdists):
    fork = make_fork(tmp_path, pristine("v0.19.2"), overlapping=False)
    sdist = sdists("v0.19.2")
    before = git(fork, "rev-parse", "internal")
    # another release's series: the fork's version.txt says 0.19.2
    proc = run(["bash", APPLY, "v0.19.8", "--onto", "internal"], cwd=fork)
    assert proc.returncode == E_VERIFY and "is DeepSpeed 0.19.2, not v0.19.8" in proc.stderr, proc.stderr
    proc = run(["bash", APPLY, "v0.19.2", "--onto", "no-such-branch", "--sdist", sdist], cwd=fork)
    assert proc.returncode == E_CHECKOUT and "branch no-such-branch does not exist" in proc.stderr, proc.stderr
    (fork / COORD).write_text((fork / COORD).read_text() + "# uncommitted\n")
    proc = run(["bash", APPLY, "v0.19.2", "--onto", "internal", "--sdist", sdist], cwd=fork)
    assert proc.returncode == E_CHECKOUT and "uncommitted changes" in proc.stderr, proc.stderr
    git(fork, "checkout", "--", COORD)
    proc = run(["bash", APPLY, "v0.19.2", "--onto", "internal", "--sdist", sdist], cwd=tmp_path)
    assert proc.returncode == E_CHECKOUT and "--checkout FORK" in proc.stderr, proc.stderr
    assert git(fork, "rev-parse", "internal") == before
    # --checkout names the fork from anywhere
    proc = run(["bash", APPLY, "v0.19.2", "--onto", "internal", "--checkout", fork, "--sdist", sdist], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr


def test_upgrade_a_fork_from_the_v0_19_2_series_to_v0_19_8_and_its_follow_up(tmp_path, pristine, sdists):
    """The upgrade of docs/guide/forks.md: a fork carrying the v0.19.2 series moves to v0.19.8: its own
    commit is replayed onto v0.19.8, the v0.19.2 series is dropped (v0.19.8 has upstream's #8148), and
    apply.sh --onto brings the v0.19.8 follow-up."""
    fork = make_fork(tmp_path, pristine("v0.19.2"), overlapping=False)
    own = git(fork, "rev-parse", "HEAD")
    git(fork, "tag", "v0.19.2", "HEAD~1")  # a real fork has upstream's tags; here the pristine import
    run(["bash", APPLY, "v0.19.2", "--onto", "internal", "--sdist", sdists("v0.19.2")], cwd=fork, check=True)
    old_series = series_subjects("v0.19.2")
    assert git(fork, "log", "--reverse", "--format=%s", "v0.19.2..internal").splitlines() == \
        [git(fork, "log", "-1", "--format=%s", own)] + old_series
    # upstream's v0.19.8, as a fork fetches it (here the sdist import with upstream's tests/ snapshot)
    git(fork, "fetch", "-q", "--no-tags", pristine("v0.19.8"), "+refs/heads/zero3/v0.19.8:refs/tags/v0.19.8")

    git(fork, "switch", "-q", "-c", "internal-v0.19.8", "internal")
    rebase = run(["git", "-C", fork, "rebase", "-i", "--onto", "v0.19.8", "v0.19.2"],
                 extra_env={**FORK_IDENTITY, "GIT_SEQUENCE_EDITOR": f"bash {REPO / 'scripts' / 'drop-series.sh'} v0.19.2"})
    assert rebase.returncode == 0, rebase.stderr
    assert f"dropped {len(old_series)} commit(s) of the v0.19.2 series, kept 1" in rebase.stderr
    assert git(fork, "log", "--format=%s", "v0.19.8..HEAD").splitlines() == \
        ["internal: count releases for our dashboards"]
    proc = run(["bash", APPLY, "v0.19.8", "--onto", "internal-v0.19.8", "--sdist", sdists("v0.19.8")], cwd=fork)
    assert proc.returncode == 0, proc.stderr
    assert git(fork, "log", "--reverse", "--format=%s", "v0.19.8..internal-v0.19.8").splitlines() == \
        ["internal: count releases for our dashboards"] + series_subjects("v0.19.8")
    assert "fork_release_calls" in (fork / COORD).read_text() and (fork / OFFLOAD).read_text().endswith(OFFLOAD_TAIL)
    assert (fork / "version.txt").read_text().strip() == "0.19.8"
    no_operation_in_progress(fork)
    # the old branch is untouched
    assert git(fork, "log", "--reverse", "--format=%s", "v0.19.2..internal").splitlines()[1:] == old_series


def test_per_commit_proof_plans_each_fork_commit_with_its_prefix(tmp_path, pristine, sdists):
    """scripts/prove-series.sh --fork PATH RANGE: each commit of the fork's range is proven with the prefix of
    the series its history carries, the fork's own commits with the prefix below them (--dry-run: the plan);
    a fork that carries a patch without the ones before it is refused, naming the commit."""
    fork = make_fork(tmp_path, pristine("v0.19.2"), overlapping=False)
    git(fork, "tag", "v0.19.2", "HEAD~1")
    run(["bash", APPLY, "v0.19.2", "--onto", "internal", "--patches", "2", "--sdist", sdists("v0.19.2")], cwd=fork,
        check=True)
    (fork / "FORK_NOTES.md").write_text("ours\n")
    git(fork, "add", "FORK_NOTES.md")
    git(fork, "commit", "-q", "-m", "internal: notes")
    prove = REPO / "scripts" / "prove-series.sh"
    proc = run(["bash", prove, "--fork", fork, "v0.19.2..internal", "--dry-run"], check=True)
    subjects = series_subjects("v0.19.2")
    plan = [line for line in proc.stdout.splitlines() if line.startswith("== ") and ": prefix " in line]
    expected = [("internal: count releases for our dashboards", 0), (subjects[0], 1), (subjects[1], 2),
                ("internal: notes", 2)]
    assert len(plan) == len(expected), proc.stdout
    for line, (subject, n) in zip(plan, expected):
        assert f" {subject}: prefix {n}: " in line, line

    # patch 2 without patch 1: not a prefix of the series
    git(fork, "switch", "-q", "-c", "partial", "v0.19.2")
    git(fork, "cherry-pick", "internal~1")  # the series' second patch
    proc = run(["bash", prove, "--fork", fork, "v0.19.2..partial", "--dry-run"])
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAILED: its history carries patches of the series that are not a prefix" in proc.stderr
    assert "FAIL  not a prefix" in proc.stdout


def test_tox_fork_refuses_a_fork_it_cannot_test_before_installing_anything(tmp_path, pristine):
    """scripts/test-fork.sh (tox -e fork) checks its input first: one path, a DeepSpeed clone, a release with a
    series, the whole series on HEAD (or ZERO3_SERIES_PREFIX); each refusal says what to do instead."""
    script = REPO / "scripts" / "test-fork.sh"
    proc = run(["bash", script])
    assert proc.returncode == 2 and "usage: tox -e fork -- /path/to/your/DeepSpeed" in proc.stderr, proc.stderr
    proc = run(["bash", script, tmp_path])
    assert proc.returncode == 2 and "is not a git checkout of DeepSpeed" in proc.stderr, proc.stderr
    fork = make_fork(tmp_path, pristine("v0.19.2"), overlapping=False)
    proc = run(["bash", script, fork])
    n = len(series_subjects("v0.19.2"))
    assert proc.returncode == 2, proc.stderr
    assert f"carries 0 of the {n} patches of the v0.19.2 series" in proc.stderr
    assert "scripts/apply.sh v0.19.2 --onto BRANCH" in proc.stderr
    proc = run(["bash", script, fork], extra_env={"ZERO3_VERSION": "v0.9.9"})
    assert proc.returncode == 2 and "no series for v0.9.9" in proc.stderr, proc.stderr
