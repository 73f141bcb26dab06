"""scripts/tox-step.sh: the torch index probe, the fallback, the stamps, and the skipped upstream-style run.

pip is replaced by a fake interpreter that records its pip calls (and pretends to install), so nothing is
downloaded; the probe itself runs in the real interpreter against servers on the loopback interface.
"""

import http.server
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
STEP = REPO / "scripts" / "tox-step.sh"

FAKE_PYTHON = """#!/usr/bin/env bash
# Answers tox-step.sh's questions about "the environment" from $FAKE_PREFIX; records pip calls there.
if [[ $1 == -c && $2 == *sys.prefix* ]]; then echo "$FAKE_PREFIX"; exit 0; fi
if [[ $1 == -c && $2 == *importlib.metadata* ]]; then cat "$FAKE_PREFIX/installed-$3" 2>/dev/null; exit 0; fi
if [[ $1 == -m && $2 == pip ]]; then
    shift 2
    echo "$*" >>"$FAKE_PREFIX/pip-calls"
    for a; do [[ $a == torch==* ]] && echo "${a#torch==}+fake" >"$FAKE_PREFIX/installed-torch"; done
    # Installing a tree: like pip, rewrite one of its tracked files (an sdist tracks deepspeed.egg-info/).
    for a; do
        [[ -d $a/.git ]] && echo "rewritten by pip" >>"$a/PKG-INFO" && echo 0.19.2 >"$FAKE_PREFIX/installed-deepspeed"
    done
    exit 0
fi
if [[ $1 == -m && $2 == tests.upstream_compat.run ]]; then echo "upstream-style run: $*"; exit 0; fi
exec "$REAL_PYTHON" "$@"
"""


@pytest.fixture
def fake(tmp_path):
    prefix = tmp_path / "env"
    prefix.mkdir()
    python = tmp_path / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "ZERO3_TORCH_INDEX"))}
    env.update(PYTHON=str(python), FAKE_PREFIX=str(prefix), REAL_PYTHON=sys.executable)
    return prefix, env


def step(env, *args, **extra):
    return subprocess.run(["bash", str(STEP), *args], env=dict(env, **extra), capture_output=True, text=True,
                          timeout=120)


def pip_calls(prefix):
    path = prefix / "pip-calls"
    return path.read_text().splitlines() if path.exists() else []


@pytest.fixture
def silent_index():
    """A loopback port that accepts connections and never answers: an index that hangs."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        yield f"http://127.0.0.1:{server.getsockname()[1]}/whl/cpu"


@pytest.fixture
def answering_index():
    """A loopback HTTP server that answers every GET with 200, standing in for a reachable index."""

    class Handler(http.server.BaseHTTPRequestHandler):

        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"<html></html>")

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/whl/cpu"
    server.shutdown()
    server.server_close()


def test_reachable_index_gives_the_cpu_build_then_the_rest_with_torch_pinned(fake, answering_index):
    prefix, env = fake
    proc = step(env, "deps", "torch==2.13.0", "pytest==9.2.0", "wheel", ZERO3_TORCH_INDEX=answering_index)
    assert proc.returncode == 0, proc.stderr
    assert pip_calls(prefix) == [
        f"install --disable-pip-version-check --extra-index-url {answering_index} torch==2.13.0",
        f"install --disable-pip-version-check -c {prefix}/zero3-torch-pin.txt pytest==9.2.0 wheel",
    ]
    assert (prefix / "zero3-torch-pin.txt").read_text() == "torch==2.13.0+fake\n"
    assert f"torch==2.13.0: the CPU build from {answering_index}" in proc.stdout
    assert "deps: done in" in proc.stdout
    # The same request again: nothing to do, and it says so.
    again = step(env, "deps", "torch==2.13.0", "pytest==9.2.0", "wheel", ZERO3_TORCH_INDEX=answering_index)
    assert "deps: already installed (torch==2.13.0 pytest==9.2.0 wheel)" in again.stdout
    assert len(pip_calls(prefix)) == 2


def test_unreachable_index_fails_fast_and_falls_back_with_a_warning(fake, silent_index):
    prefix, env = fake
    start = time.monotonic()
    proc = step(env, "deps", "torch==2.13.0", ZERO3_TORCH_INDEX=silent_index, ZERO3_TORCH_INDEX_TIMEOUT="2")
    elapsed = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr
    assert elapsed < 15, elapsed
    assert f"warning: torch index {silent_index} not reachable within 2 s" in proc.stderr
    assert "From PyPI that is the CUDA build" in proc.stderr and "torch-2.13.0+cpu wheel" in proc.stderr
    assert pip_calls(prefix) == ["install --disable-pip-version-check torch==2.13.0"]


@pytest.mark.parametrize("setting", [{"PIP_NO_INDEX": "1"}, {"ZERO3_TORCH_INDEX": "none"}])
def test_no_probe_offline_or_when_turned_off(fake, silent_index, setting):
    prefix, env = fake
    env = dict(env, ZERO3_TORCH_INDEX=silent_index, ZERO3_TORCH_INDEX_TIMEOUT="60")
    start = time.monotonic()
    proc = step(env, "deps", "torch==2.13.0", **setting)
    assert proc.returncode == 0, proc.stderr
    assert time.monotonic() - start < 30  # the silent index was never asked
    assert pip_calls(prefix) == ["install --disable-pip-version-check torch==2.13.0"]


def test_installed_torch_is_kept(fake, silent_index):
    prefix, env = fake
    (prefix / "installed-torch").write_text("2.13.0+cpu\n")
    proc = step(env, "deps", "torch==2.13.0", ZERO3_TORCH_INDEX=silent_index, ZERO3_TORCH_INDEX_TIMEOUT="60")
    assert "torch 2.13.0+cpu already installed" in proc.stdout
    assert pip_calls(prefix) == []


def test_failing_pip_shows_its_log(fake):
    prefix, env = fake
    failing = prefix.parent / "failing-python"
    failing.write_text(FAKE_PYTHON.replace('echo "$*" >>"$FAKE_PREFIX/pip-calls"',
                                           'echo "ERROR: No matching distribution found for $*"; exit 1'))
    failing.chmod(0o755)
    proc = step(env, "deps", "nosuchpackage==1", PYTHON=str(failing))
    assert proc.returncode == 1
    assert "pip install -c" in proc.stderr and "nosuchpackage==1 failed" in proc.stderr
    assert "ERROR: No matching distribution found" in proc.stderr


def test_upstream_compat_runs_only_without_test_paths(fake, tmp_path):
    _, env = fake
    proc = step(env, "upstream-compat", str(tmp_path))
    assert proc.returncode == 0 and f"upstream-style run: -m tests.upstream_compat.run {tmp_path} -q" in proc.stdout
    proc = step(env, "upstream-compat", str(tmp_path), "tests/test_apply.py", "-x")
    assert proc.returncode == 0 and "upstream-style run" not in proc.stdout
    assert (f"test paths given (tests/test_apply.py -x): the upstream-style tests of {tmp_path} are not run"
            in proc.stdout)


def test_tree_is_reinstalled_only_when_it_changed(fake, tmp_path):
    prefix, env = fake
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "PKG-INFO").write_text("as in the sdist\n")
    ident = ["-c", "user.name=T", "-c", "user.email=t@example.invalid"]
    subprocess.run(["git", "init", "-q", str(tree)], check=True)
    subprocess.run(["git", "-C", str(tree), *ident, "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(tree), *ident, "commit", "-q", "-m", "base"], check=True)
    assert "installed deepspeed 0.19.2 from" in step(env, "deepspeed", str(tree)).stdout
    # pip rewrote a tracked file during the install: that alone is no reason to install again.
    again = step(env, "deepspeed", str(tree))
    assert "already installed" in again.stdout, again.stdout + again.stderr
    assert len(pip_calls(prefix)) == 1
    (tree / "new.py").write_text("x = 1\n")
    subprocess.run(["git", "-C", str(tree), *ident, "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(tree), *ident, "commit", "-q", "-m", "a change"], check=True)
    assert "installed deepspeed" in step(env, "deepspeed", str(tree)).stdout
    (tree / "new.py").write_text("x = 2\n")  # uncommitted edits count too
    assert "installed deepspeed" in step(env, "deepspeed", str(tree)).stdout
    assert len(pip_calls(prefix)) == 3


def test_unknown_step_is_refused(fake):
    _, env = fake
    proc = step(env, "frobnicate")
    assert proc.returncode == 2 and "unknown step 'frobnicate'" in proc.stderr
