"""integrations/trl: the TRL patch applies to TRL 1.16.0 and its own test passes, and the DeepSpeed
feature its gate looks for is what the series provides (and pristine v0.19.2 lacks)."""

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_frozen_ckpt import scenario_runner

REPO = Path(__file__).resolve().parents[1]
TRL_DIR = REPO / "integrations" / "trl"


def gate_functions():
    """The function names the patch's gate looks for, read from the line the patch adds."""
    (patch, ) = TRL_DIR.glob("0001-*.patch")
    match = re.search(r"^\+DEEPSPEED_ZERO3_NON_REENTRANT_FIX_FUNCTIONS = (\(.*\))$", patch.read_text(), re.M)
    assert match, f"{patch.name} no longer adds DEEPSPEED_ZERO3_NON_REENTRANT_FIX_FUNCTIONS"
    return list(ast.literal_eval(match.group(1)))


def test_trl_patch_applies_and_its_test_passes(tmp_path):
    proc = subprocess.run(["bash", str(TRL_DIR / "check.sh"), "--dest",
                           str(tmp_path / "trl"), "--python", sys.executable],
                          capture_output=True,
                          text=True,
                          timeout=600)
    output = proc.stdout + proc.stderr
    if proc.returncode == 7 and os.environ.get("PIP_NO_INDEX"):
        pytest.skip(f"offline (PIP_NO_INDEX) and no TRL sdist in PIP_FIND_LINKS or TRL_SDIST: {output.strip()}")
    assert proc.returncode == 0, output
    assert re.search(r"^\d+ passed", proc.stdout, re.M), output


@pytest.mark.needs_patch(1)
def test_trl_gate_recognizes_the_series(rank_pool, request):
    functions = gate_functions()
    assert "in_backward_graph_task" in functions
    scenario_runner(rank_pool, request)("tests.scenarios.trl_sft:trl_gate_feature", functions=functions)
