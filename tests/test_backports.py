"""The backport series (patches/v0.19.1, ...) correspond patch by patch to the series they were
ported from: same count, subjects and test files, ported from that series as it is now. Drift (a
change to patches/v0.19.2/ not carried to a backport) fails here, without building anything;
scripts/port-series.sh carries it over."""

import importlib.util
import os
import subprocess
from pathlib import Path

import pytest

from tests.sdists import offline_and_missing

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("backport_env", ROOT / "scripts" / "backport_env.py")
backport_env = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(backport_env)

BASES = backport_env.backport_bases()


def test_backports_exist():
    assert {"v0.19.1", "v0.19.0", "v0.18.9", "v0.17.6"} <= set(BASES), BASES


@pytest.mark.parametrize("version", BASES)
def test_backport_corresponds_to_its_source(version):
    assert backport_env.correspondence_problems(version) == []


def _copy_patches(tmp_path, monkeypatch):
    """A copy of patches/ that the checks read instead of the repository's."""
    subprocess.run(["cp", "-r", str(ROOT / "patches"), str(tmp_path / "patches")], check=True)
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "pinned-bases.tsv").write_bytes((ROOT / "scripts" / "pinned-bases.tsv").read_bytes())
    monkeypatch.setattr(backport_env, "ROOT", tmp_path)
    return tmp_path / "patches"


def test_drift_in_the_source_series_is_caught(tmp_path, monkeypatch):
    patches = _copy_patches(tmp_path, monkeypatch)
    source = patches / "v0.19.2" / (patches / "v0.19.2" / "series").read_text().split()[1]
    text = source.read_text()
    # a change to the source patch that the backports do not have: one more added line
    hunk_line = next(line for line in text.splitlines() if line.startswith("+") and not line.startswith("+++"))
    source.write_text(text.replace("\n" + hunk_line + "\n", "\n" + hunk_line + "\n+# drift\n", 1))
    for version in BASES:
        problems = backport_env.correspondence_problems(version)
        assert any("ported from another version of v0.19.2's" in p for p in problems), problems
        assert problems[-1] == f"carry the v0.19.2 series over again: scripts/port-series.sh {version} --from v0.19.2"


def test_hand_edited_unchanged_backport_is_caught(tmp_path, monkeypatch):
    patches = _copy_patches(tmp_path, monkeypatch)
    ported = patches / "v0.19.1" / (patches / "v0.19.1" / "series").read_text().split()[0]
    text = ported.read_text()
    assert "): unchanged:" in text.split("\n---\n", 1)[0].replace("\n", " ")
    hunk_line = next(line for line in text.splitlines() if line.startswith("+") and not line.startswith("+++"))
    ported.write_text(text.replace("\n" + hunk_line + "\n", "\n" + hunk_line + "\n+# edited\n", 1))
    problems = backport_env.correspondence_problems("v0.19.1")
    assert any("says 'unchanged' but adds or removes other lines" in p for p in problems), problems


def test_missing_and_renamed_patches_are_caught(tmp_path, monkeypatch):
    patches = _copy_patches(tmp_path, monkeypatch)
    series = patches / "v0.19.0" / "series"
    names = series.read_text().split()
    series.write_text("\n".join(names[:-1]) + "\n")
    n = len(names)
    problems = backport_env.correspondence_problems("v0.19.0")
    assert f"v0.19.0: {n - 1} patches, the v0.19.2 series has {n}" in problems
    series.write_text("\n".join(names) + "\n")
    last = patches / "v0.19.0" / names[-1]
    prefix = f"Subject: [PATCH {n}/{n}] "
    assert prefix in last.read_text()
    last.write_text(last.read_text().replace(prefix, prefix + "renamed ", 1))
    problems = backport_env.correspondence_problems("v0.19.0")
    assert any(p.startswith(f"v0.19.0 patch {n}") and "subject 'renamed " in p for p in problems), problems


def _repo_copy(tmp_path):
    """scripts/ and patches/ of this repository in a scratch directory, for port-series.sh to
    build and export into."""
    copy = tmp_path / "repo"
    copy.mkdir()
    for part in ("scripts", "patches"):
        subprocess.run(["cp", "-r", str(ROOT / part), str(copy / part)], check=True)
    return copy


def _port(copy, *args):
    reason = offline_and_missing("v0.19.2", args[0])
    if reason:
        pytest.skip(f"port-series.sh builds v0.19.2 and {args[0]} from their sdists: {reason}")
    # Both bases from their sdists (DEEPSPEED_SDIST, else PyPI): where GitHub is reachable,
    # apply.sh would otherwise clone all of DeepSpeed for v0.19.2 first.
    # The copy is not beside ../shared: name the snapshot of upstream's tests v0.19.2's base carries.
    env = dict(os.environ, DEEPSPEED_GIT_URL=str(copy / "no-such-clone"))
    env.setdefault("ZERO3_UPSTREAM_TESTS", str(ROOT.parent / "shared" / "upstream-tests"))
    return subprocess.run(["bash", str(copy / "scripts" / "port-series.sh"), *args], cwd=copy, env=env,
                          capture_output=True, text=True, timeout=600)


def test_port_reproduces_the_committed_v0_19_1_series(tmp_path):
    """v0.19.1 needs no hand resolution (the change to upstream's test file, which v0.19.1's sdist
    lacks, is left out by the script), so porting the v0.19.2 series again must give the committed
    files byte for byte (apply.sh gets the sdists from DEEPSPEED_SDIST or PyPI)."""
    copy = _repo_copy(tmp_path)
    for f in (copy / "patches" / "v0.19.1").glob("0*.patch"):
        f.unlink()
    run = _port(copy, "v0.19.1")
    assert run.returncode == 0, run.stderr
    for f in sorted((ROOT / "patches" / "v0.19.1").iterdir()):
        assert (copy / "patches" / "v0.19.1" / f.name).read_bytes() == f.read_bytes(), f.name


def test_port_carries_a_changed_message_of_the_source_patch(tmp_path):
    """A port after the source series changed only in a message (the diffs the same, so apply.sh
    would keep its scratch tree as it is) carries the new message, as a port from scratch would."""
    copy = _repo_copy(tmp_path)
    assert _port(copy, "v0.19.1").returncode == 0
    source = copy / "patches" / "v0.19.2" / (copy / "patches" / "v0.19.2" / "series").read_text().split()[0]
    text = source.read_text()
    head, rest = text.split("\n---\n", 1)
    source.write_text(head + "\n\nA sentence added to the message alone.\n---\n" + rest)
    run = _port(copy, "v0.19.1")
    assert run.returncode == 0, run.stderr
    ported = copy / "patches" / "v0.19.1" / source.name
    assert "A sentence added to the message alone." in ported.read_text()


def test_port_stops_on_a_conflict_and_says_what_to_do(tmp_path):
    copy = _repo_copy(tmp_path)
    run = _port(copy, "v0.17.6")
    assert run.returncode == 4, run.stderr
    # v0.17.6's engine.compile() has no compiled autograd, where 0005 adds its warning
    # (patches/v0.17.6/port-notes.txt)
    n = len((ROOT / "patches" / "v0.19.2" / "series").read_text().split())
    assert f"patch 5 of {n} conflicts on v0.17.6" in run.stderr
    assert "conflicting file(s), in " in run.stderr and "deepspeed/runtime/engine.py" in run.stderr
    assert "scripts/port-series.sh v0.17.6 --continue" in run.stderr
    again = _port(copy, "v0.17.6")
    assert again.returncode == 6 and "--continue or --abort it first" in again.stderr
    aborted = _port(copy, "v0.17.6", "--abort")
    assert aborted.returncode == 0, aborted.stderr
    # the committed series is untouched by a port that stopped
    for f in sorted((ROOT / "patches" / "v0.17.6").iterdir()):
        assert (copy / "patches" / "v0.17.6" / f.name).read_bytes() == f.read_bytes(), f.name
