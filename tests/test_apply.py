"""Tests for scripts/apply.sh and scripts/export-patches.sh.

They run the scripts as a user would (bash, real git, the real DeepSpeed sdist) in temporary
directories. The sdist is looked for where apply.sh looks (ZERO3_TEST_SDIST, then DEEPSPEED_SDIST,
a file or a directory, then the directories of PIP_FIND_LINKS), else downloaded once with pip; the
tests that need it skip, saying why, when none of that gives it (offline, without a wheelhouse).

Two patch series are used:
- a small synthetic series built here on the sdist tree (exercises every code path without
  depending on the project's patches), and
- the project's real patches/ series, for the end-to-end and round-trip tests. Those fail, with
  a message saying why, when patches/series is missing: CI must never pass without them.
"""

import email
import email.policy
import hashlib
import os
import re
import shutil
import subprocess
import tarfile
import time
import urllib.request
from pathlib import Path

import pytest

from tests.sdists import index_disabled, local_sdist, sdist_name

REPO = Path(__file__).resolve().parents[1]
APPLY = REPO / "scripts" / "apply.sh"
EXPORT = REPO / "scripts" / "export-patches.sh"
VERSION = "v0.19.2"
UPSTREAM = "b919284ab1ad6dbc1cb0e06b10386ff74160b586"
SDIST_NAME = sdist_name(VERSION)
SDIST_SHA = "7e854b6ebe3d2bfa239f82958372927631c74e5324c7f08f17ce7ff5f6b06969"
BRANCH = "zero3/" + VERSION
# The base apply.sh makes of the v0.19.2 sdist and the pinned snapshot of upstream's tests/: the same
# on every machine and git version.
SDIST_BASE = "8f06ae5b82b58afb485ff1a14ce66585a3a6a2eb"

# Exit codes documented in apply.sh --help and docs/guide/troubleshooting.md.
E_USAGE, E_VERSION, E_FOREIGN, E_DIFFERENT, E_CHECKOUT, E_NOBASE, E_VERIFY, E_PATCH, E_SERIES = range(2, 11)

# Variables that would change which source apply.sh picks or where it looks; each test sets
# what it needs explicitly.
_SCRUBBED = ("DEEPSPEED_SDIST", "DEEPSPEED_GIT_URL", "ZERO3_PINNED_BASES", "DEEPSPEED_GIT_TIMEOUT",
             "DEEPSPEED_GIT_PROBE_TIMEOUT", "GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE")

SYNTH_AUTHOR = {"GIT_AUTHOR_NAME": "Synthetic Author", "GIT_AUTHOR_EMAIL": "synthetic@example.invalid"}


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED}
    # The v0.19.2 base carries upstream's tests/ from a pinned snapshot, which apply.sh looks for beside
    # the repository; tests that run a copy of the scripts elsewhere need to be told where it is.
    env.setdefault("ZERO3_UPSTREAM_TESTS", str(REPO.parent / "shared" / "upstream-tests"))
    # A machine without a git identity (fresh CI) must still work; tests that need one set it.
    env.update(extra)
    return env


def run(cmd, cwd=None, env=None, check=False):
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env or clean_env(), capture_output=True,
                          text=True, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def apply(*args, env=None, cwd=None):
    return run(["bash", APPLY, *args], cwd=cwd, env=env)


def export(*args, env=None):
    return run(["bash", EXPORT, *args], env=env)


def git(repo, *args, env=None):
    return run(["git", "-C", repo, *args], env=env, check=True).stdout.strip()


def ok(proc):
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc


def refused(proc, code, *needles):
    """The run failed with exit `code` and its error output contains every needle."""
    assert proc.returncode == code, f"expected exit {code}, got {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    for needle in needles:
        assert needle in proc.stderr, f"{needle!r} not in stderr:\n{proc.stderr}"


def printed_path(proc):
    m = re.search(r"^  path:\s+(.*)$", proc.stdout, re.M)
    assert m, proc.stdout
    return Path(m.group(1))


def series_of(patch_dir):
    names = []
    for line in (Path(patch_dir) / "series").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.append(line)
    return names


def patch_subject(path):
    with open(path, "rb") as fh:
        msg = email.message_from_binary_file(fh, policy=email.policy.default)
    subject = " ".join(str(msg["Subject"]).split())
    return re.sub(r"^\[PATCH[^\]]*\]\s*", "", subject)


def commits_since(repo, base, ref="HEAD"):
    out = git(repo, "log", "--reverse", "--format=%s", f"{base}..{ref}")
    return out.splitlines() if out else []


def base_of(repo, branch=BRANCH):
    return git(repo, "config", "--get", f"branch.{branch}.zero3base")


def write_pinned(path, commit, sha=SDIST_SHA):
    path.write_text("# test pinned bases\n" + "\t".join([VERSION, commit, SDIST_NAME, sha]) + "\n")
    return path


def copy_repo(src, dst):
    shutil.copytree(src, dst, symlinks=True)
    return dst


# ---------------------------------------------------------------------------------------------
# Session fixtures: the sdist, one pristine import of it, a synthetic series.


def _pypi_reachable():
    try:
        urllib.request.urlopen("https://pypi.org/simple/deepspeed/", timeout=15).close()
        return True
    except OSError:
        return False


@pytest.fixture(scope="session")
def sdist(tmp_path_factory):
    found = local_sdist(VERSION)
    if found:
        return found
    if index_disabled():
        pytest.skip(f"{SDIST_NAME} is not in ZERO3_TEST_SDIST, DEEPSPEED_SDIST or PIP_FIND_LINKS, and PIP_NO_INDEX "
                    "forbids downloading it")
    dest = tmp_path_factory.mktemp("sdist")
    # A bounded download: an index that does not answer must end in a skip, not in the session's timeout.
    proc = run(["python3", "-m", "pip", "download", "--timeout", "30", "--retries", "1", "--no-deps", "--no-binary",
                ":all:", "deepspeed==0.19.2", "-d", dest])
    if proc.returncode != 0 or not (dest / SDIST_NAME).is_file():
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        pytest.skip(f"{SDIST_NAME} is not in ZERO3_TEST_SDIST, DEEPSPEED_SDIST or PIP_FIND_LINKS, and pip download "
                    f"failed: {last}")
    return dest / SDIST_NAME


@pytest.fixture(scope="session")
def pristine_tree(tmp_path_factory, sdist):
    """A pristine checkout made by apply.sh from the sdist; copy it, never modify it."""
    dest = tmp_path_factory.mktemp("pristine") / "ds"
    ok(apply(VERSION, "--pristine", "--sdist", sdist, "--dest", dest))
    return dest


def _commit_all(repo, message, date):
    env = clean_env(**SYNTH_AUTHOR, GIT_AUTHOR_DATE=date, GIT_COMMITTER_NAME="Synthetic Author",
                    GIT_COMMITTER_EMAIL="synthetic@example.invalid", GIT_COMMITTER_DATE=date)
    git(repo, "add", "-A", env=env)
    git(repo, "commit", "-q", "-s", "-m", message, env=env)


@pytest.fixture(scope="session")
def synthetic_series(tmp_path_factory, pristine_tree):
    """Three small patches on the sdist tree, exported with export-patches.sh."""
    root = tmp_path_factory.mktemp("synthetic")
    tree = copy_repo(pristine_tree, root / "tree")
    test_file = tree / "tests" / "unit" / "v1" / "zero" / "test_synthetic_series.py"
    test_file.parent.mkdir(parents=True, exist_ok=True)
    test_file.write_text("# Copyright (c) DeepSpeed Team.\n# SPDX-License-Identifier: Apache-2.0\n\n"
                         "# DeepSpeed Team\n\n\ndef test_synthetic():\n    assert True\n")
    _commit_all(tree, "Z3: add a synthetic test\n\nOnly used by tests/test_apply.py.", "2026-07-01T10:00:00+0200")
    coord = tree / "deepspeed" / "runtime" / "zero" / "partitioned_param_coordinator.py"
    text = coord.read_text()
    anchor = "    def release_sub_module(self, submodule: Module, forward=False) -> None:\n"
    assert anchor in text
    coord.write_text(text.replace(anchor, anchor + "        # synthetic series: first change\n", 1))
    _commit_all(tree, "ZeRO-3: synthetic change to the coordinator", "2026-07-02T11:30:00+0200")
    coord.write_text(coord.read_text().replace("# synthetic series: first change",
                                               "# synthetic series: second change", 1))
    _commit_all(tree, "ZeRO-3: a second synthetic change with a long subject line to fold",
                "2026-07-03T12:45:00-0700")
    out = root / "patches"
    ok(export("--tree", tree, "--out", out))
    return out


@pytest.fixture(scope="session")
def real_series():
    if not (REPO / "patches" / "v0.19.2" / "series").is_file():
        pytest.fail("patches/v0.19.2/series is missing: the project's patch series must be in patches/v0.19.2/ "
                    "(generate it with scripts/export-patches.sh); this test never skips")
    return REPO / "patches" / "v0.19.2"


@pytest.fixture(params=["synthetic", "real"])
def series_dir(request):
    return request.getfixturevalue(f"{request.param}_series")


@pytest.fixture
def upstream_repo(tmp_path, pristine_tree):
    """A local stand-in for upstream: a repo whose tag v0.19.2 is the pristine base, plus a
    pinned-bases file naming that commit (the real upstream id cannot be forged)."""
    up = copy_repo(pristine_tree, tmp_path / "upstream")
    git(up, "tag", VERSION, "HEAD")
    git(up, "checkout", "-q", "-b", "master")
    # Leave nothing of apply.sh's in the stand-in upstream.
    git(up, "branch", "-q", "-D", BRANCH)
    git(up, "tag", "-d", "zero3-base/" + VERSION)
    (up / ".git" / "zero3-apply").unlink()
    pinned = write_pinned(tmp_path / "pinned.tsv", git(up, "rev-parse", "HEAD"))
    return up, pinned


@pytest.fixture
def fork(tmp_path, upstream_repo):
    """A user's clone of upstream with branches of their own, on branch `work`."""
    up, pinned = upstream_repo
    fork = tmp_path / "fork"
    run(["git", "clone", "-q", up, fork], check=True)
    env = clean_env(GIT_AUTHOR_NAME="U", GIT_AUTHOR_EMAIL="u@example.invalid", GIT_COMMITTER_NAME="U",
                    GIT_COMMITTER_EMAIL="u@example.invalid")
    git(fork, "checkout", "-q", "-b", "work", "master")
    (fork / "MY_NOTES.txt").write_text("mine\n")
    git(fork, "add", "MY_NOTES.txt", env=env)
    git(fork, "commit", "-q", "-m", "my own work", env=env)
    return fork, pinned


def branches(repo):
    return dict(
        line.split(" ", 1)[::-1] for line in git(repo, "for-each-ref", "--format=%(objectname) %(refname:short)",
                                                 "refs/heads/").splitlines())


def broken_copy(series_dir, dest, index=1):
    """Copy a series, changing a context line of patch `index` so that it cannot apply."""
    shutil.copytree(series_dir, dest)
    name = series_of(dest)[index]
    lines = (dest / name).read_text().splitlines(keepends=True)
    in_hunk = False
    for i, line in enumerate(lines):
        in_hunk = in_hunk or line.startswith("@@ ")
        if in_hunk and line.startswith(" "):
            lines[i] = line.rstrip("\n") + " garbled\n"
            break
    else:
        pytest.fail(f"{name} has no context line; cannot break it")
    (dest / name).write_text("".join(lines))
    return name


# ---------------------------------------------------------------------------------------------
# End to end


def test_help_documents_options_and_exit_codes():
    proc = ok(apply("--help"))
    for opt in ("--patches", "--pristine", "--dest", "--force", "--source", "--patch-dir", "--checkout", "--sdist"):
        assert opt in proc.stdout
    for code in range(0, 11):
        assert re.search(rf"^  {code}\s", proc.stdout, re.M), f"exit code {code} undocumented"
    assert re.search(r"^  130 interrupted", proc.stdout, re.M)


def test_sdist_end_to_end(tmp_path, sdist, series_dir):
    dest = tmp_path / "out" / "ds"
    proc = ok(apply(VERSION, "--sdist", sdist, "--dest", dest, "--patch-dir", series_dir))
    assert printed_path(proc) == dest
    assert "sdist" in proc.stdout
    base = base_of(dest)
    assert git(dest, "rev-parse", "HEAD~%d" % len(series_of(series_dir))) == base
    assert commits_since(dest, base) == [patch_subject(series_dir / p) for p in series_of(series_dir)]
    for subject in commits_since(dest, base):
        assert subject in proc.stdout
    # The base is the sdist import plus a commit with upstream's tests/ (the pinned snapshot).
    imported = git(dest, "rev-parse", base + "~1")
    message = git(dest, "log", "-1", "--format=%B", imported)
    assert f"Upstream-commit: {UPSTREAM}" in message and SDIST_SHA in message
    assert git(dest, "status", "--porcelain") == ""
    # The import commit holds exactly the sdist's files; the next one adds files under tests/ only.
    with tarfile.open(sdist) as tf:
        files = sorted(m.name.split("/", 1)[1] for m in tf.getmembers() if m.isfile())
    assert git(dest, "ls-tree", "-r", "--name-only", imported).splitlines() == files
    added = git(dest, "diff", "--name-only", "--diff-filter=A", imported, base).splitlines()
    assert "tests/unit/common.py" in added and all(p.startswith("tests/") for p in added)
    assert git(dest, "diff", "--name-only", "--diff-filter=MD", imported, base) == ""


def test_default_destination_is_build_dir(tmp_path, sdist):
    # Run a copy of the scripts so that the default (REPO/build/deepspeed-VERSION) lands in tmp.
    fake = tmp_path / "proj"
    shutil.copytree(REPO / "scripts", fake / "scripts")
    proc = ok(run(["bash", fake / "scripts" / "apply.sh", VERSION, "--pristine", "--sdist", sdist]))
    assert printed_path(proc) == fake / "build" / f"deepspeed-{VERSION}"


def test_sdist_base_commit_is_deterministic(tmp_path, sdist, pristine_tree):
    env = clean_env(TZ="Pacific/Kiritimati", GIT_AUTHOR_NAME="Someone Else", GIT_AUTHOR_DATE="2011-11-11T11:11:11",
                    GIT_COMMITTER_DATE="2012-12-12T12:12:12", LC_ALL="C")
    dest = tmp_path / "again"
    ok(apply(VERSION, "--pristine", "--sdist", sdist, "--dest", dest, env=env))
    assert base_of(dest) == base_of(pristine_tree) == SDIST_BASE
    assert git(dest, "log", "-1", "--format=%an|%ae|%aI|%cn|%ce|%cI") == git(
        pristine_tree, "log", "-1", "--format=%an|%ae|%aI|%cn|%ce|%cI")


def test_real_pip_download_path(tmp_path):
    if index_disabled():
        pytest.skip("PIP_NO_INDEX is set: this test downloads the sdist from PyPI")
    if not _pypi_reachable():
        pytest.skip("PyPI is unreachable from this machine")
    env = clean_env()
    env.pop("PIP_FIND_LINKS", None)  # make sure the sdist comes from pip, not a local wheelhouse
    proc = ok(apply(VERSION, "--pristine", "--source", "sdist", "--dest", tmp_path / "ds", env=env))
    assert "downloading " + SDIST_NAME in proc.stderr
    assert f"sha256 {SDIST_SHA} verified" in proc.stderr


def test_tests_find_the_sdist_where_apply_sh_does(tmp_path, monkeypatch):
    wheelhouse = tmp_path / "wheelhouse"
    wheelhouse.mkdir()
    (wheelhouse / SDIST_NAME).write_bytes(b"stand-in")
    for name in ("ZERO3_TEST_SDIST", "DEEPSPEED_SDIST", "PIP_FIND_LINKS"):
        monkeypatch.delenv(name, raising=False)
    assert local_sdist(VERSION) is None
    monkeypatch.setenv("PIP_FIND_LINKS", f"/nonexistent file://{wheelhouse}")
    assert local_sdist(VERSION) == wheelhouse / SDIST_NAME
    monkeypatch.setenv("DEEPSPEED_SDIST", str(tmp_path / "other.tar.gz"))  # missing: the next place counts
    assert local_sdist(VERSION) == wheelhouse / SDIST_NAME
    monkeypatch.setenv("ZERO3_TEST_SDIST", str(wheelhouse))
    assert local_sdist(VERSION) == wheelhouse / SDIST_NAME


def test_sdist_found_in_pip_find_links(tmp_path, sdist):
    wheelhouse = tmp_path / "wheelhouse"
    wheelhouse.mkdir()
    shutil.copy(sdist, wheelhouse / SDIST_NAME)
    env = clean_env(PIP_FIND_LINKS=f"/nonexistent file://{wheelhouse}")
    proc = ok(apply(VERSION, "--pristine", "--source", "sdist", "--dest", tmp_path / "ds", env=env))
    assert f"using sdist {wheelhouse}/{SDIST_NAME}" in proc.stderr


def test_auto_falls_back_from_git_to_sdist_quickly(tmp_path, sdist):
    # Port 9 on loopback refuses at once: stands in for an unreachable upstream without network.
    env = clean_env(DEEPSPEED_GIT_URL="http://127.0.0.1:9/DeepSpeed.git", DEEPSPEED_SDIST=str(sdist))
    start = time.monotonic()
    proc = ok(apply(VERSION, "--pristine", "--dest", tmp_path / "ds", env=env))
    assert time.monotonic() - start < 60
    assert "source git unavailable" in proc.stderr
    assert "source:  sdist" in proc.stdout


def test_git_source_unreachable_fails_fast(tmp_path):
    env = clean_env(DEEPSPEED_GIT_URL="http://127.0.0.1:9/DeepSpeed.git")
    start = time.monotonic()
    refused(apply(VERSION, "--pristine", "--source", "git", "--dest", tmp_path / "ds", env=env), E_NOBASE,
            "no source could provide")
    assert time.monotonic() - start < 60
    assert not (tmp_path / "ds").exists()


def test_git_source_end_to_end(tmp_path, upstream_repo, synthetic_series):
    up, pinned = upstream_repo
    env = clean_env(DEEPSPEED_GIT_URL=f"file://{up}", ZERO3_PINNED_BASES=str(pinned))
    dest = tmp_path / "ds"
    proc = ok(apply(VERSION, "--source", "git", "--dest", dest, "--patch-dir", synthetic_series, env=env))
    assert "git clone of file://" in proc.stdout
    assert base_of(dest) == git(up, "rev-parse", VERSION)
    assert commits_since(dest, base_of(dest)) == [
        patch_subject(synthetic_series / p) for p in series_of(synthetic_series)
    ]


def test_checkout_source_makes_a_new_branch_only(upstream_repo, fork, synthetic_series):
    repo, pinned = fork
    before = branches(repo)
    env = clean_env(ZERO3_PINNED_BASES=str(pinned))
    proc = ok(apply(VERSION, "--checkout", repo, "--patch-dir", synthetic_series, env=env))
    assert printed_path(proc) == repo
    after = branches(repo)
    assert {k: after[k] for k in before} == before  # the user's branches are untouched
    assert set(after) - set(before) == {BRANCH}
    assert git(repo, "symbolic-ref", "--short", "HEAD") == BRANCH
    assert git(repo, "rev-parse", f"{BRANCH}~3") == git(repo, "rev-parse", VERSION)
    # It says that it moved the checkout's HEAD, how to go back, and what it wrote to the git config.
    assert f"switched the HEAD of {repo} from work to the new branch {BRANCH}; to go back: git -C {repo} switch work" \
        in proc.stderr
    assert (f"wrote branch.{BRANCH}.zero3version, .zero3upstream, .zero3base and .zero3source to {repo}/.git/config"
            in proc.stderr)
    assert git(repo, "config", "--get", f"branch.{BRANCH}.zero3version") == VERSION
    # Same request again: recognised.
    again = ok(apply(VERSION, "--checkout", repo, "--patch-dir", synthetic_series, env=env))
    assert "already applied" in again.stdout


def test_patches_n_and_pristine(tmp_path, sdist, synthetic_series):
    ok(apply(VERSION, "--sdist", sdist, "--dest", tmp_path / "two", "--patch-dir", synthetic_series, "--patches", "2"))
    assert len(commits_since(tmp_path / "two", base_of(tmp_path / "two"))) == 2
    ok(apply(VERSION, "--sdist", sdist, "--dest", tmp_path / "none", "--patch-dir", synthetic_series, "--pristine"))
    assert commits_since(tmp_path / "none", base_of(tmp_path / "none")) == []


def test_rerun_recognises_existing_destination(tmp_path, sdist, synthetic_series):
    dest = tmp_path / "ds"
    args = (VERSION, "--sdist", sdist, "--dest", dest, "--patch-dir", synthetic_series)
    ok(apply(*args))
    head = git(dest, "rev-parse", "HEAD")
    again = ok(apply(*args))
    assert again.stdout.startswith("already applied")
    assert printed_path(again) == dest
    assert git(dest, "rev-parse", "HEAD") == head
    # A different request is refused until --force, which rebuilds to the same commit ids.
    refused(apply(*args, "--patches", "1"), E_DIFFERENT, "--force",
            f"every commit on {BRANCH} is a patch of the series")
    assert git(dest, "rev-parse", "HEAD") == head
    forced = ok(apply(*args, "--patches", "1", "--force"))
    assert (f"--force: replacing {dest} (it held version {VERSION} with 3 patch(es) on branch {BRANCH} at "
            f"{head[:7]}" in forced.stderr)
    assert len(commits_since(dest, base_of(dest))) == 1
    ok(apply(*args, "--force"))
    assert git(dest, "rev-parse", "HEAD") == head


def test_refusal_and_force_name_the_commits_force_deletes(tmp_path, sdist, synthetic_series):
    dest = tmp_path / "ds"
    args = (VERSION, "--sdist", sdist, "--dest", dest, "--patch-dir", synthetic_series)
    ok(apply(*args, "--patches", "1"))
    (dest / "MY_WORK.txt").write_text("mine\n")
    env = clean_env(GIT_AUTHOR_NAME="U", GIT_AUTHOR_EMAIL="u@example.invalid", GIT_COMMITTER_NAME="U",
                    GIT_COMMITTER_EMAIL="u@example.invalid")
    git(dest, "add", "MY_WORK.txt", env=env)
    git(dest, "commit", "-q", "-m", "my own experiment", env=env)
    mine = git(dest, "rev-parse", "--short", "HEAD")
    (dest / "setup.py").write_text("edited\n")
    proc = apply(*args)
    refused(proc, E_DIFFERENT, "re-run with --force to re-create it",
            f"1 commit(s) on {BRANCH} are not in the series and --force deletes them",
            f"{mine} my own experiment", "uncommitted changes that --force deletes too: setup.py")
    forced = ok(apply(*args, "--force"))
    assert f"--force: replacing {dest} (it held version {VERSION} with 2 patch(es)" in forced.stderr
    assert f"{mine} my own experiment" in forced.stderr
    assert not (dest / "MY_WORK.txt").exists()


def test_refusal_in_a_checkout_names_the_commits_force_deletes(fork, synthetic_series):
    repo, pinned = fork
    env = clean_env(ZERO3_PINNED_BASES=str(pinned), GIT_AUTHOR_NAME="U", GIT_AUTHOR_EMAIL="u@example.invalid",
                    GIT_COMMITTER_NAME="U", GIT_COMMITTER_EMAIL="u@example.invalid")
    ok(apply(VERSION, "--checkout", repo, "--patch-dir", synthetic_series, "--patches", "2", env=env))
    git(repo, "commit", "-q", "--allow-empty", "-m", "a note on the branch", env=env)
    note = git(repo, "rev-parse", "--short", "HEAD")
    refused(apply(VERSION, "--checkout", repo, "--patch-dir", synthetic_series, env=env), E_DIFFERENT,
            "re-run with --force to re-create the branch", f"{note} a note on the branch")
    forced = ok(apply(VERSION, "--checkout", repo, "--patch-dir", synthetic_series, "--force", env=env))
    assert f"--force: replacing branch {BRANCH} (it held version {VERSION} with 3 patch(es) at {note}" in forced.stderr
    # The checkout was on the replaced branch: it stays there, on the new commits.
    assert f"the HEAD of {repo} was on {BRANCH} and stays on it, now the re-created branch" in forced.stderr
    assert git(repo, "symbolic-ref", "--short", "HEAD") == BRANCH
    assert commits_since(repo, VERSION, BRANCH) == [patch_subject(synthetic_series / p) for p in
                                                     series_of(synthetic_series)]


# ---------------------------------------------------------------------------------------------
# Refusals: each asserts the exit code and message that only the check in question produces.


def test_pinned_line_with_spaces_is_malformed(tmp_path):
    pinned = tmp_path / "pinned.tsv"
    pinned.write_text(" ".join([VERSION, UPSTREAM, SDIST_NAME, SDIST_SHA]) + "\n")
    proc = apply(VERSION, "--pristine", "--dest", tmp_path / "ds", env=clean_env(ZERO3_PINNED_BASES=str(pinned)))
    refused(proc, E_VERSION, f"malformed line for {VERSION} in {pinned}", "separated by one TAB each")
    assert not (tmp_path / "ds").exists()


def test_unknown_version_is_refused(tmp_path):
    refused(apply("v0.0.1", "--pristine", "--dest", tmp_path / "ds"), E_VERSION, "unknown version 'v0.0.1'")
    assert not (tmp_path / "ds").exists()


@pytest.mark.parametrize("args", [
    ["0.19.2"],
    [VERSION, "--patches", "two"],
    [VERSION, "--patches", "-1"],
    [VERSION, "--source", "svn"],
    [VERSION, "--frobnicate"],
    [VERSION, "--dest"],
    [VERSION, VERSION],
    [VERSION, "--pristine", "--patches", "2"],
    [VERSION, "--checkout", "/tmp", "--dest", "/tmp/x"],
    [VERSION, "--branch", "bad..name"],
])
def test_malformed_arguments_are_refused(tmp_path, args):
    proc = apply(*args, cwd=tmp_path)
    refused(proc, E_USAGE, "apply.sh: error:")
    assert list(tmp_path.iterdir()) == []


def test_tampered_sdist_is_refused(tmp_path, sdist):
    # Repack the sdist with one file changed: same name, different sha256.
    src = tmp_path / "src"
    src.mkdir()
    with tarfile.open(sdist) as tf:
        tf.extractall(src, filter="data")
    victim = src / "deepspeed-0.19.2" / "deepspeed" / "runtime" / "zero" / "stage3.py"
    victim.write_text(victim.read_text() + "# tampered\n")
    bad = tmp_path / "bad" / SDIST_NAME
    bad.parent.mkdir()
    with tarfile.open(bad, "w:gz") as tf:
        tf.add(src / "deepspeed-0.19.2", arcname="deepspeed-0.19.2")
    found = hashlib.sha256(bad.read_bytes()).hexdigest()
    proc = apply(VERSION, "--pristine", "--sdist", bad.parent, "--dest", tmp_path / "ds")
    refused(proc, E_VERIFY, "base verification failed", f"expected {SDIST_SHA}", f"is {found}")
    assert not (tmp_path / "ds").exists()


def test_sdist_with_entries_outside_its_directory_is_refused(tmp_path, sdist):
    # Even a sha256 that matches (here: a pinned file naming the odd archive) does not let an
    # archive place files outside the expected top directory.
    odd = tmp_path / SDIST_NAME
    with tarfile.open(odd, "w:gz") as tf:
        (tmp_path / "evil.txt").write_text("x")
        tf.add(tmp_path / "evil.txt", arcname="evil.txt")
    pinned = write_pinned(tmp_path / "pinned.tsv", UPSTREAM, hashlib.sha256(odd.read_bytes()).hexdigest())
    proc = apply(VERSION, "--pristine", "--sdist", odd, "--dest", tmp_path / "ds",
                 env=clean_env(ZERO3_PINNED_BASES=str(pinned)))
    refused(proc, E_VERIFY, "entry outside deepspeed-0.19.2/")
    assert not (tmp_path / "ds").exists()


def test_git_tag_at_another_commit_is_refused(tmp_path, upstream_repo):
    up, pinned = upstream_repo
    expected = git(up, "rev-parse", VERSION)
    env = clean_env(GIT_AUTHOR_NAME="x", GIT_AUTHOR_EMAIL="x@x.invalid", GIT_COMMITTER_NAME="x",
                    GIT_COMMITTER_EMAIL="x@x.invalid")
    git(up, "commit", "-q", "--allow-empty", "-m", "not the release", env=env)
    git(up, "tag", "-f", VERSION, "HEAD")
    found = git(up, "rev-parse", "HEAD")
    env = clean_env(DEEPSPEED_GIT_URL=f"file://{up}", ZERO3_PINNED_BASES=str(pinned))
    proc = apply(VERSION, "--pristine", "--source", "git", "--dest", tmp_path / "ds", env=env)
    refused(proc, E_VERIFY, "base verification failed", f"is commit {found}", f"expected pinned commit {expected}")
    assert not (tmp_path / "ds").exists()


def test_checkout_tag_at_another_commit_is_refused(fork):
    repo, pinned = fork
    expected = git(repo, "rev-parse", VERSION)
    git(repo, "tag", "-f", VERSION, "work")
    before = branches(repo)
    proc = apply(VERSION, "--pristine", "--checkout", repo, env=clean_env(ZERO3_PINNED_BASES=str(pinned)))
    refused(proc, E_VERIFY, f"expected pinned commit {expected}", f"is commit {git(repo, 'rev-parse', 'work')}")
    assert branches(repo) == before
    assert git(repo, "symbolic-ref", "--short", "HEAD") == "work"


def test_checkout_without_pinned_commit_is_refused(tmp_path, fork):
    repo, _ = fork
    pinned = write_pinned(tmp_path / "other.tsv", "1" * 40)
    git(repo, "tag", "-d", VERSION)
    proc = apply(VERSION, "--pristine", "--checkout", repo, env=clean_env(ZERO3_PINNED_BASES=str(pinned)))
    refused(proc, E_NOBASE, "is not in", "fetch it first")


def test_dirty_checkout_is_refused(fork, synthetic_series):
    repo, pinned = fork
    (repo / "MY_NOTES.txt").write_text("uncommitted edit\n")
    before = branches(repo)
    proc = apply(VERSION, "--checkout", repo, "--patch-dir", synthetic_series,
                 env=clean_env(ZERO3_PINNED_BASES=str(pinned)))
    refused(proc, E_CHECKOUT, "has uncommitted changes")
    assert branches(repo) == before
    assert (repo / "MY_NOTES.txt").read_text() == "uncommitted edit\n"


def test_foreign_branch_in_checkout_is_refused(fork):
    repo, pinned = fork
    git(repo, "branch", BRANCH, "master")
    before = branches(repo)
    proc = apply(VERSION, "--pristine", "--checkout", repo, "--force", env=clean_env(ZERO3_PINNED_BASES=str(pinned)))
    refused(proc, E_CHECKOUT, f"branch {BRANCH} already exists", "not created by apply.sh")
    assert branches(repo) == before


def test_not_a_checkout_is_refused(tmp_path):
    refused(apply(VERSION, "--pristine", "--checkout", tmp_path), E_CHECKOUT, "is not a git checkout")


@pytest.mark.parametrize("force", [False, True])
def test_foreign_destination_is_refused(tmp_path, sdist, force):
    dest = tmp_path / "mine"
    dest.mkdir()
    (dest / "precious.txt").write_text("keep me\n")
    args = [VERSION, "--pristine", "--sdist", sdist, "--dest", dest] + (["--force"] if force else [])
    refused(apply(*args), E_FOREIGN, "exists and was not created by apply.sh")
    assert [p.name for p in dest.iterdir()] == ["precious.txt"]
    assert (dest / "precious.txt").read_text() == "keep me\n"


def test_failing_patch_leaves_nothing_behind(tmp_path, sdist, synthetic_series):
    patches = tmp_path / "broken"
    name = broken_copy(synthetic_series, patches)
    keep = tmp_path / "existing"
    keep.mkdir()
    (keep / "other.txt").write_text("not ours\n")
    dest = keep / "new" / "deeper" / "ds"
    proc = apply(VERSION, "--sdist", sdist, "--dest", dest, "--patch-dir", patches)
    refused(proc, E_PATCH, f"patch {name} (2 of 3) did not apply",
            "deepspeed/runtime/zero/partitioned_param_coordinator.py", "nothing of this run is left")
    # git am's own advice is about the am apply.sh already aborted; its "Patch failed at 0001" counts within a
    # one-patch am. Neither is passed on.
    assert "git am: error: patch failed" in proc.stderr
    for advice in ("--continue", "--abort", "--skip", "hint:", "Patch failed at"):
        assert advice not in proc.stderr, proc.stderr
    # Only what this run created is gone: the new directories, not the pre-existing parent.
    assert sorted(p.name for p in keep.iterdir()) == ["other.txt"]


def test_failing_patch_restores_the_checkout(fork, synthetic_series, tmp_path):
    repo, pinned = fork
    patches = tmp_path / "broken"
    name = broken_copy(synthetic_series, patches)
    before = branches(repo)
    proc = apply(VERSION, "--checkout", repo, "--patch-dir", patches, env=clean_env(ZERO3_PINNED_BASES=str(pinned)))
    refused(proc, E_PATCH, f"patch {name}", "did not apply")
    assert branches(repo) == before
    assert git(repo, "symbolic-ref", "--short", "HEAD") == "work"
    assert git(repo, "status", "--porcelain") == ""
    assert not (repo / git(repo, "rev-parse", "--git-path", "rebase-apply")).exists()


def test_failed_force_keeps_the_previous_tree(tmp_path, sdist, synthetic_series):
    dest = tmp_path / "ds"
    ok(apply(VERSION, "--sdist", sdist, "--dest", dest, "--patch-dir", synthetic_series, "--patches", "1"))
    head = git(dest, "rev-parse", "HEAD")
    patches = tmp_path / "broken"
    broken_copy(synthetic_series, patches)
    refused(apply(VERSION, "--sdist", sdist, "--dest", dest, "--patch-dir", patches, "--force"), E_PATCH)
    assert git(dest, "rev-parse", "HEAD") == head
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken", "ds"]


def test_series_problems_are_refused(tmp_path, sdist, synthetic_series):
    refused(apply(VERSION, "--sdist", sdist, "--dest", tmp_path / "a", "--patch-dir", synthetic_series, "--patches",
                  "4"), E_SERIES, "has only 3 patches")
    empty = tmp_path / "empty"
    empty.mkdir()
    refused(apply(VERSION, "--sdist", sdist, "--dest", tmp_path / "b", "--patch-dir", empty), E_SERIES,
            "no series file")
    missing = tmp_path / "missing"
    shutil.copytree(synthetic_series, missing)
    (missing / series_of(missing)[0]).unlink()
    refused(apply(VERSION, "--sdist", sdist, "--dest", tmp_path / "c", "--patch-dir", missing), E_SERIES,
            "does not exist")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "missing"]


@pytest.mark.parametrize("name", ["x; touch pwned", "$(touch pwned)", "`touch pwned`", "a' ; touch pwned ; '",
                                  "-rf ; touch pwned"])
def test_shell_metacharacters_are_inert(tmp_path, sdist, name):
    proc = ok(apply(VERSION, "--pristine", "--sdist", sdist, "--dest", "./" + name, cwd=tmp_path))
    assert printed_path(proc) == tmp_path / name
    assert not (tmp_path / "pwned").exists()
    assert (tmp_path / name / ".git").is_dir()


@pytest.mark.parametrize("opt", ["--patches", "--branch", "--source"])
def test_shell_metacharacters_in_options_are_refused(tmp_path, opt):
    proc = apply(VERSION, opt, "1; touch pwned", cwd=tmp_path)
    refused(proc, E_USAGE)
    assert not (tmp_path / "pwned").exists()


# ---------------------------------------------------------------------------------------------
# Export


def test_export_round_trip_is_byte_identical(tmp_path, sdist, series_dir):
    dest = tmp_path / "ds"
    ok(apply(VERSION, "--sdist", sdist, "--dest", dest, "--patch-dir", series_dir))
    out = tmp_path / "exported"
    ok(export("--tree", dest, "--out", out))
    expected = sorted(p.name for p in series_dir.iterdir() if p.name == "series" or p.suffix == ".patch")
    assert sorted(p.name for p in out.iterdir()) == expected
    for name in expected:
        assert (out / name).read_bytes() == (series_dir / name).read_bytes(), f"{name} differs"
    cover = (out / "0000-cover-letter.patch").read_text()
    assert f"\nbase-commit: {UPSTREAM}\n" in cover
    assert base_of(dest) not in cover


def test_export_from_git_checkout_matches_sdist_export(tmp_path, upstream_repo, synthetic_series):
    # A tree built from git gives the same files as one built from the sdist (the base-commit
    # line names the upstream commit either way; here the stand-in upstream's).
    up, pinned = upstream_repo
    env = clean_env(DEEPSPEED_GIT_URL=f"file://{up}", ZERO3_PINNED_BASES=str(pinned))
    dest = tmp_path / "ds"
    ok(apply(VERSION, "--source", "git", "--dest", dest, "--patch-dir", synthetic_series, env=env))
    out = tmp_path / "exported"
    ok(export("--tree", dest, "--out", out))
    for name in series_of(synthetic_series):
        assert (out / name).read_bytes() == (synthetic_series / name).read_bytes()


def test_export_replaces_only_stale_patches(tmp_path, sdist, synthetic_series):
    dest = tmp_path / "ds"
    ok(apply(VERSION, "--sdist", sdist, "--dest", dest, "--patch-dir", synthetic_series, "--patches", "2"))
    out = tmp_path / "out"
    shutil.copytree(synthetic_series, out)
    (out / "README").write_text("not a patch\n")
    ok(export("--tree", dest, "--out", out))
    assert series_of(out) == series_of(synthetic_series)[:2]
    assert sorted(p.name for p in out.iterdir()) == sorted(["README", "series", "0000-cover-letter.patch"] +
                                                           series_of(synthetic_series)[:2])
    assert "[PATCH 0/2]" in (out / "0000-cover-letter.patch").read_text()


# ---------------------------------------------------------------------------------------------
# Documentation


def _message_fragments(shell_string):
    """Literal pieces of a double-quoted shell string, with every expansion cut out."""
    pieces, literal, i = [], "", 0
    while i < len(shell_string):
        ch = shell_string[i]
        if ch == "\\" and i + 1 < len(shell_string):
            literal += shell_string[i + 1]
            i += 2
        elif ch == "$" and i + 1 < len(shell_string) and shell_string[i + 1] in "({":
            pieces.append(literal)
            literal = ""
            opening = shell_string[i + 1]
            closing = ")" if opening == "(" else "}"
            depth, i = 1, i + 2
            while depth:
                depth += {opening: 1, closing: -1}.get(shell_string[i], 0)
                i += 1
        elif ch == "$" and i + 1 < len(shell_string) and (shell_string[i + 1].isalnum() or shell_string[i + 1] in "_#?"):
            pieces.append(literal)
            literal = ""
            i += 2
            while i < len(shell_string) and (shell_string[i].isalnum() or shell_string[i] == "_"):
                i += 1
        else:
            literal += ch
            i += 1
    pieces.append(literal)
    return [p for p in pieces if len(p.strip()) >= 3]


def test_troubleshooting_page_quotes_every_apply_error():
    # the one place the messages are explained (README.md links to it)
    script = APPLY.read_text()
    readme_lines = (REPO / "docs" / "guide" / "troubleshooting.md").read_text().splitlines()
    messages = [m.group(1) for m in re.finditer(r'die "\$E_[A-Z]+" "(.*)"(?:\s*;;)?$', script, re.M)]
    messages += [m.group(1) for m in re.finditer(r'FAIL_REASON="(.*)"$', script, re.M)]
    assert len(messages) > 40
    missing = []
    for message in messages:
        fragments = _message_fragments(message)
        if not any(_in_order(fragments, line) for line in readme_lines):
            missing.append(message)
    assert not missing, "docs/guide/troubleshooting.md lacks:\n" + "\n".join(missing)


def _in_order(fragments, line):
    pos = 0
    for fragment in fragments:
        pos = line.find(fragment, pos)
        if pos < 0:
            return False
        pos += len(fragment)
    return True


# ---------------------------------------------------------------------------------------------
# Identity: the committed patches name no person; the submitter's identity is added on submission

PREPARE = REPO / "scripts" / "prepare-submission.sh"


def _header(patch_text):
    return patch_text.split("\n\n", 1)[0]


def test_committed_patches_name_no_person():
    for series in sorted((REPO / "patches").glob("*/series")):
        for patch in [series.parent / "0000-cover-letter.patch"] + [series.parent / n for n in series_of(series.parent)]:
            text = patch.read_text()
            assert "\nFrom: " not in _header(text), f"{patch} names an author"
            message = text.split("\n---\n", 1)[0]
            assert "Signed-off-by:" not in message, f"{patch} carries a sign-off"


def test_export_drops_the_author_and_sign_off(synthetic_series):
    # the synthetic commits were made with `git commit -s` by "Synthetic Author"
    for name in ["0000-cover-letter.patch"] + series_of(synthetic_series):
        text = (synthetic_series / name).read_text()
        assert "Synthetic Author" not in text and "synthetic@example.invalid" not in text, name
    assert "\nPatches (3):\n" in (synthetic_series / "0000-cover-letter.patch").read_text()


def test_applied_patches_are_authored_by_whoever_applies_them(tmp_path, sdist, synthetic_series):
    dest = tmp_path / "ds"
    env = clean_env(GIT_COMMITTER_NAME="Applier", GIT_COMMITTER_EMAIL="applier@example.invalid")
    ok(apply(VERSION, "--sdist", sdist, "--dest", dest, "--patch-dir", synthetic_series, env=env))
    authors = git(dest, "log", "--format=%an <%ae>", f"{base_of(dest)}..HEAD").splitlines()
    assert authors == ["Applier <applier@example.invalid>"] * 3


def _submission_repo(tmp_path, synthetic_series):
    """A copy of this repository's scripts with the synthetic series as v0.19.2, split in two batches."""
    repo = tmp_path / "repo"
    shutil.copytree(REPO / "scripts", repo / "scripts")
    shutil.copytree(synthetic_series, repo / "patches" / VERSION)
    names = series_of(synthetic_series)
    (repo / "patches" / VERSION / "batches").write_text(
        f"# test batches\nfirst  {names[0][:4]}\nrest   {names[1][:4]} {names[2][:4]}\n")
    (repo / "patches" / VERSION / "batch-rest.txt").write_text("Coordinator changes\n\nTwo small changes.\n")
    run(["git", "init", "-q", repo], check=True)
    return repo


def _submitter_env(tmp_path, sdist, identity):
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    (home / ".gitconfig").write_text("".join(f"[user]\n\t{k} = {v}\n" for k, v in identity.items()))
    return clean_env(HOME=str(home), GIT_CONFIG_NOSYSTEM="1", DEEPSPEED_SDIST=str(sdist))


@pytest.mark.parametrize("identity", [{}, {"name": "Ada Submitter"}, {"email": "ada@example.org"}])
def test_submission_without_an_identity_is_refused(tmp_path, sdist, synthetic_series, identity):
    repo = _submission_repo(tmp_path, synthetic_series)
    out = tmp_path / "out"
    proc = run(["bash", repo / "scripts" / "prepare-submission.sh", VERSION, "rest", "--out", out],
               env=_submitter_env(tmp_path, sdist, identity))
    refused(proc, 3, "no git identity", "git config --global user.name")
    assert not out.exists()


def test_submission_is_authored_and_signed_off_by_the_submitter(tmp_path, sdist, synthetic_series):
    repo = _submission_repo(tmp_path, synthetic_series)
    out = tmp_path / "out"
    env = _submitter_env(tmp_path, sdist, {"name": "Ada Submitter", "email": "ada@example.org"})
    proc = ok(run(["bash", repo / "scripts" / "prepare-submission.sh", VERSION, "rest", "--out", out], env=env))
    assert "authored and signed off by Ada Submitter <ada@example.org>" in proc.stdout
    patches = sorted(out.glob("0*.patch"))
    assert [p.name[:4] for p in patches] == ["0000", "0001", "0002"]
    assert "Subject: [PATCH 0/2] Coordinator changes" in patches[0].read_text()
    for patch in patches[1:]:
        text = patch.read_text()
        assert "\nFrom: Ada Submitter <ada@example.org>\n" in _header(text)
        assert text.split("\n---\n", 1)[0].rstrip().endswith("Signed-off-by: Ada Submitter <ada@example.org>")
    # the two patches are the synthetic ones, unchanged
    assert [patch_subject(p) for p in patches[1:]] == [patch_subject(synthetic_series / n)
                                                       for n in series_of(synthetic_series)[1:]]


def test_submission_of_an_unknown_batch_is_refused(tmp_path, sdist, synthetic_series):
    repo = _submission_repo(tmp_path, synthetic_series)
    env = _submitter_env(tmp_path, sdist, {"name": "Ada Submitter", "email": "ada@example.org"})
    proc = run(["bash", repo / "scripts" / "prepare-submission.sh", VERSION, "nope"], env=env)
    refused(proc, 4, "no batch 'nope'", "batches: first rest all")


def test_every_batch_names_patches_of_its_series_once():
    for batches in sorted((REPO / "patches").glob("*/batches")):
        names = series_of(batches.parent)
        listed = [n for line in batches.read_text().splitlines() if line.strip() and not line.startswith("#")
                  for n in line.split()[1:]]
        assert sorted(listed) == sorted(n[:4] for n in names), f"{batches}: every patch in exactly one batch"


def test_each_batch_letter_carries_its_reproduction_verbatim():
    """The cover letter of a batch (the pull request's description) quotes the reproduction script that
    scripts/prove_batches.py runs: it fails on the release and passes with the batch."""
    for batches in sorted((REPO / "patches").glob("*/batches")):
        names = [line.split()[0] for line in batches.read_text().splitlines() if line.strip() and not line.startswith("#")]
        for name in names:
            letter = batches.parent / f"batch-{name}.txt"
            repro = batches.parent / "repro" / f"{name}.py"
            assert letter.is_file() and repro.is_file(), f"{batches.parent.name}: batch {name} needs a letter and a repro"
            quoted = "".join("    " + line if line.strip() else line for line in repro.read_text().splitlines(True))
            assert quoted in letter.read_text(), f"{letter.name} does not quote repro/{repro.name} as it is"
            assert len(repro.read_text().splitlines()) <= 16, f"repro/{repro.name}: keep it short"


# What a DeepSpeed maintainer receives in the upstream proposal: our own vocabulary in none of its files,
# messages read in two minutes, and tests sized to the code they cover.
PROJECT_VOCABULARY = re.compile(r"fuzz|family|Needs: 0|series-|v0\.19\.2's series")
MAX_MESSAGE_LINES = 25
MAX_ADDED_TEST_LINES = 800


def _message_lines(patch_text):
    """Lines of a format-patch's commit message: the subject (one line, however the header wraps it), a
    blank line and the body."""
    message = email.message_from_string(patch_text.partition("\n---\n")[0], policy=email.policy.default)
    body = message.get_payload().strip("\n")
    return 2 + len(body.splitlines()) if body else 1


def _added_test_lines(patch_text):
    added, in_tests = 0, False
    for line in patch_text.partition("\n---\n")[2].splitlines():
        if line.startswith("diff --git "):
            in_tests = line.rsplit(" b/", 1)[-1].startswith("tests/")
        elif in_tests and line.startswith("+") and not line.startswith("+++"):
            added += 1
    return added


def test_proposal_checks_catch_long_messages_and_test_lines():
    body = "\n".join(f"line {i}" for i in range(MAX_MESSAGE_LINES))
    patch = (f"From 0 Mon Sep 17 00:00:00 2001\nSubject: [PATCH] ZeRO-3: a\n\n{body}\n---\n"
             "diff --git a/tests/unit/t.py b/tests/unit/t.py\n+++ b/tests/unit/t.py\n+x\n+y\n"
             "diff --git a/deepspeed/z.py b/deepspeed/z.py\n+++ b/deepspeed/z.py\n+z\n")
    assert _message_lines(patch) == MAX_MESSAGE_LINES + 2
    assert _added_test_lines(patch) == 2
    assert PROJECT_VOCABULARY.search("Needs: 0006") and not PROJECT_VOCABULARY.search("ZeRO-3: keep params")


def test_v0198_proposal_reads_as_an_upstream_patch_series():
    proposal = REPO / "patches" / "v0.19.8"
    for path in sorted(p for p in proposal.rglob("*") if p.is_file()):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            assert not PROJECT_VOCABULARY.search(line), f"{path.relative_to(REPO)}:{number}: {line.strip()}"
    patches = [p for p in sorted(proposal.glob("[0-9][0-9][0-9][0-9]-*.patch")) if not p.name.startswith("0000-")]
    assert patches
    for patch in patches:
        lines = _message_lines(patch.read_text())
        assert lines <= MAX_MESSAGE_LINES, f"{patch.name}: a {lines}-line message (at most {MAX_MESSAGE_LINES})"
    added = sum(_added_test_lines(p.read_text()) for p in patches)
    assert added <= MAX_ADDED_TEST_LINES, f"the proposal adds {added} test lines (at most {MAX_ADDED_TEST_LINES})"


def test_checkout_not_left_mid_am_with_a_message_saying_otherwise(fork, synthetic_series, tmp_path):
    """When the failed am cannot be aborted (here a git whose `am --abort` fails, as it does on a locked
    index), apply.sh must not say that nothing is left: it says what is left and how to clean it up."""
    repo, pinned = fork
    patches = tmp_path / "broken"
    broken_copy(synthetic_series, patches)
    shim = tmp_path / "shim"
    shim.mkdir()
    real_git = shutil.which("git")
    (shim / "git").write_text("#!/bin/sh\n"
                              "case \" $* \" in *' am --abort '*) echo 'fatal: Unable to create index.lock' >&2; exit 128;; esac\n"
                              f"exec {real_git} \"$@\"\n")
    (shim / "git").chmod(0o755)
    env = clean_env(ZERO3_PINNED_BASES=str(pinned), PATH=f"{shim}{os.pathsep}{os.environ['PATH']}")
    proc = apply(VERSION, "--checkout", repo, "--patch-dir", patches, env=env)
    assert proc.returncode == E_PATCH, proc.stderr
    in_am = (repo / git(repo, "rev-parse", "--git-path", "rebase-apply")).exists()
    assert in_am  # the shim kept the am from being aborted
    assert "nothing of this run is left" not in proc.stderr, proc.stderr
    assert "the am was aborted" not in proc.stderr, proc.stderr
    assert "is in the middle of a git operation (rebase-apply)" in proc.stderr, proc.stderr
    assert f"git -C {repo} am --abort" in proc.stderr, proc.stderr
    # the printed clean-up, with the real git, leaves the checkout as it was
    cleanup = re.search(r"To clean up: (.*)$", proc.stderr, re.M).group(1)
    for command in cleanup.split("; "):
        run(command.split(), check=True)
    assert git(repo, "symbolic-ref", "--short", "HEAD") == "work"
    assert not (repo / git(repo, "rev-parse", "--git-path", "rebase-apply")).exists()
    assert "zero3/v0.19.2-apply-tmp" not in git(repo, "branch")
