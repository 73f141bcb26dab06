"""The GPU benchmark script runs end to end on CPU at toy size (its figures are not checked here:
speed and memory are reported by the benchmark, not asserted by tests)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.pool import default_device

# These runs force DS_ACCELERATOR=cpu whatever the host, so a CUDA host would only repeat what
# `tox -e cpu` checks, at about 165 s of a `tox -e gpu` run (measured on one H200); there the
# benchmark itself is `tox -e bench`.
pytestmark = pytest.mark.skipif(default_device() == "cuda",
                                reason="CPU smoke runs of the benchmark scripts: tox -e cpu runs them; on a GPU "
                                "host the benchmark is tox -e bench")

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "scripts" / "bench_lifecycle.py"


def run_toy_bench(variant, out, steps):
    """One run of the benchmark script at toy size on CPU; its JSON result."""
    subprocess.run([
        sys.executable,
        str(BENCH), "--variant", variant, "--out",
        str(out), "--layers", "2", "--hidden", "256", "--seq", "32", "--batch", "2", "--steps",
        str(steps), "--warmup", "1"
    ],
                   env=dict(os.environ, DS_ACCELERATOR="cpu"),
                   check=True,
                   timeout=600)
    return json.loads(out.read_text())


def test_bench_smoke_on_cpu(tmp_path):
    pytest.importorskip("peft")
    out = tmp_path / "series.json"
    result = run_toy_bench("series", out, steps=2)
    assert "error" not in result, result["error"]
    assert result["step_s"]["n"] == 2
    assert result["allgather_gib_per_step"]["frozen"] > 0
    assert result["timeline_gib"], "the memory timeline of the last step is empty"

    md = tmp_path / "bench.md"
    subprocess.run([sys.executable, str(BENCH), "--report", str(out), "--md", str(md)], check=True, timeout=120)
    table = md.read_text()
    assert "| series |" in table and "failed" not in table

    # the report of a follow-up run (issue 14): the same measurement filed under the variants that
    # run next to each other, so that the follow-up's rows and targets are produced
    # (3 runs each, the fewest a verdict rests on; identical runs have overlapping step-time ranges)
    paths = []
    for variant in ("no-ckpt", "nonreentrant", "followup"):
        for run in range(3):
            path = tmp_path / f"{variant}-{run}.json"
            path.write_text(json.dumps(dict(result, variant=variant, tree=f"build/{variant}")))
            paths.append(str(path))
    subprocess.run([sys.executable, str(BENCH), "--report", *paths, "--md", str(md)], check=True, timeout=120)
    table = md.read_text()
    assert "| followup |" in table and "| nonreentrant |" in table
    assert "Follow-up: frozen all-gather volume per step ≤ 1.02× the run without checkpointing: **met**" in table
    assert "Follow-up vs its pristine release:" in table
    assert "(≤: not judged (<3 runs or overlapping ranges))." in table, "step time judged inside the noise"
    # fewer than 3 runs: no verdict at all
    subprocess.run([sys.executable, str(BENCH), "--report", *paths[::3], "--md", str(md)], check=True, timeout=120)
    table = md.read_text()
    assert "**met**" not in table and "**missed**" not in table and "not judged" in table


@pytest.mark.parametrize("variant", ["nocheck", "minimal-skip"])
def test_alternative_variants_run_on_cpu(tmp_path, variant):
    """The fairness variants (determinism_check="none", PR 8130's skip) reach the model: on the
    series tree they must train like the series; on pristine v0.19.2 the GPU run measures them."""
    pytest.importorskip("peft")
    result = run_toy_bench(variant, tmp_path / f"{variant}.json", steps=1)
    assert "error" not in result, result["error"]
    assert result["variant"] == variant and result["allgather_gib_per_step"]["frozen"] > 0


def test_host_overhead_profile_smoke_on_cpu(tmp_path):
    pytest.importorskip("peft")
    script = ROOT / "scripts" / "profile_host_overhead.py"
    env = dict(os.environ, DS_ACCELERATOR="cpu")
    runs = []
    for i, variant in enumerate(("series", "no-ckpt", "series")):
        out = tmp_path / f"{variant}-{i}.json"
        subprocess.run([
            sys.executable,
            str(script), "--variant", variant, "--out",
            str(out), "--layers", "2", "--steps", "1", "--warmup", "1"
        ],
                       env=env,
                       check=True,
                       timeout=600)
        result = json.loads(out.read_text())
        assert result["own_s_per_step"]["backward"], "the backward profile is empty"
        runs.append(str(out))
    md = tmp_path / "host.md"
    subprocess.run([sys.executable, str(script), "--compare", *runs, "--md", str(md)], check=True, timeout=120)
    text = md.read_text()
    assert "**Forward**" in text and "**Backward**" in text and "| series (ms/step) |" in text
    assert "series (2 runs) vs no-ckpt (1 run)" in text and " [" in text  # two series runs: a range
    # the stamp's command regenerates what was compared: these variants, these runs
    command = json.loads(text.split("zero3-stamp: ", 1)[1].split(" -->", 1)[0])["command"]
    assert "--variant series" in command and "--variant no-ckpt" in command and "nocheck" not in command, command
    one_variant = subprocess.run([sys.executable, str(script), "--compare", runs[0], runs[2]],
                                 capture_output=True, text=True, timeout=120)
    assert one_variant.returncode != 0 and "exactly two variants" in one_variant.stderr


def test_paired_blocks_take_turns_abba_and_report_the_pairs(capsys):
    """The pairing order and the figures: the per-pair differences, their mean and bootstrap interval
    (which must contain the mean), relative to the baseline's median."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from paired_blocks import report, take_turns

    order = []

    class Fake:

        def __init__(self, label, ms):
            self.label, self.ms = label, ms

        def block(self, steps):
            order.append(self.label)
            return {"wall_ms": self.ms + len(order) % 3, "cpu_ms": self.ms}

    blocks = take_turns([Fake("a", 100.0), Fake("b", 102.0)], pairs=4, block=2)
    assert order == ["a", "b", "b", "a", "a", "b", "b", "a"]
    figures = report("title", "a", "b", blocks, "cpu_ms")
    assert figures["mean_ms"] == pytest.approx(2.0) and figures["ratio"] == pytest.approx(1.02)
    low, high = figures["interval_ms"]
    assert low <= figures["mean_ms"] <= high
    ratio_low, ratio_high = figures["ratio_interval"]
    assert ratio_low <= figures["ratio"] <= ratio_high
    out = capsys.readouterr().out
    assert "b - a, per pair: median +2.000 ms (+2.00 %)" in out and "mean of the per-pair ratios: 1.0200" in out


def test_pair_report_pools_runs_of_the_same_sides_and_shape(tmp_path):
    """--pair-report prints each --pair run and then all their pairs together, each pair weighing
    the same whatever its run's length; it refuses, naming the file and what differs, a run of another
    batch size or series revision, the same file twice, a run whose sides have unequal or too few
    blocks, and a file that is not a --pair run's output."""

    def pair_run(name, batch, base_ms, ratio, pairs=4, series_id="e8dcb5973fca", drop=0):
        blocks = {"a": [{"wall_ms": base_ms + i, "cpu_ms": base_ms} for i in range(pairs)]}
        blocks["b"] = [{"wall_ms": block["wall_ms"] * ratio, "cpu_ms": base_ms} for block in blocks["a"]][drop:]
        path = tmp_path / name
        path.write_text(json.dumps({"stamp": {"series_id": series_id},
                                    "sides": [["a", "reentrant", "/t/1"], ["b", "series", "/t/2"]],
                                    "shape": ["--layers", "2", "--hidden", "64", "--seq", "8", "--batch", str(batch)],
                                    "ready": [{"warmup_losses": [1.0, 0.9], "peak_gib": 2.0}] * 2, "blocks": blocks}))
        return str(path)

    def pair_report(*paths):
        return subprocess.run([sys.executable, str(BENCH), "--pair-report", *paths], capture_output=True, text=True,
                              timeout=120)

    # a run on a slow host with 4 pairs and one on a fast host with 2: the pooled ratio is the mean of
    # the 6 pairs' ratios (4 x 1.1 and 2 x 1.0), not of the two runs' means
    runs = [pair_run("slow.json", 4, 500.0, 1.10), pair_run("fast.json", 4, 100.0, 1.00, pairs=2)]
    proc = pair_report(*runs)
    assert proc.returncode == 0, proc.stderr
    assert ": 4 pairs; a warm-up losses [1.0, 0.9], peak 2.000 GiB; b warm-up" in proc.stdout
    assert "2 runs pooled, wall time per step, 6 pairs" in proc.stdout
    assert "b / a, mean of the per-pair ratios: 1.1000, bootstrap 95 % interval 1.1000 .. 1.1000" in proc.stdout
    pooled = proc.stdout.split("pooled")[1]
    assert "b / a, mean of the per-pair ratios: 1.0667, bootstrap 95 % interval" in pooled
    # the geometric mean, which does not depend on which side is the baseline: exp((4 ln 1.1) / 6)
    assert "b / a, geometric mean of the per-pair ratios: 1.0656, bootstrap 95 % interval" in pooled
    alone = pair_report(runs[0])
    assert alone.returncode == 0 and "pooled" not in alone.stdout and ": 4 pairs;" in alone.stdout
    refused = {
        "b16.json": (pair_run("b16.json", 16, 9, 1), "--batch 16 where"),
        "old.json": (pair_run("old.json", 4, 9, 1, series_id="0123456789ab"), "series 0123456789ab where"),
        "slow.json": (runs[0], "given twice"),
        "short.json": (pair_run("short.json", 4, 9, 1, drop=1), "4 blocks of a and 3 of b"),
        "one.json": (pair_run("one.json", 4, 9, 1, pairs=1), "1 blocks of a and 1 of b"),
    }
    for name, (path, reason) in refused.items():
        proc = pair_report(runs[0], path)
        assert proc.returncode != 0 and name in proc.stderr and reason in proc.stderr, (name, proc.stderr)
        assert "Traceback" not in proc.stderr
    (tmp_path / "trace.json").write_text(json.dumps({"step_s": [0.1]}))
    not_a_pair = pair_report(str(tmp_path / "trace.json"))
    assert not_a_pair.returncode != 0 and "not the --out of a --pair run" in not_a_pair.stderr


def test_trace_report_differences_match_moved_functions_within_one_release():
    """The trace report's own-time differences pair each DeepSpeed run with the one before it of the
    same release, match a function whose line number a patch moved, sum same-named functions of a file,
    and say how much slower the second process ran functions called equally often."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from trace_step import own_time_differences

    def run(label, release, functions):
        return {"label": label, "mode": "ds", "deepspeed": release, "cprofile": {"top_ds_functions": functions}}

    workaround = run("3-old-reentrant", "0.19.2", [["zero/a.py(10): hook", 2.0, 100], ["zero/a.py(50): fetch", 10.0, 40],
                                                   ["zero/a.py(70): setup_context", 1.0, 20]])
    series = run("4-old-series", "0.19.2", [["zero/a.py(12): hook", 5.0, 90], ["zero/a.py(52): fetch", 12.0, 40],
                                            ["zero/a.py(72): setup_context", 1.0, 10],
                                            ["zero/a.py(90): setup_context", 1.5, 10], ["zero/b.py(1): new", 9.0, 5]])
    newer = run("5-new", "0.19.8", [["zero/a.py(20): hook", 1.0, 100]])
    lines = own_time_differences([workaround, series, newer], rows=5)
    text = "\n".join(lines)
    assert "4-old-series against 3-old-reentrant" in text and "5-new against" not in text
    assert "| `zero/a.py: hook` | 2.00 | 100 | 5.00 | 90 | +3.00 |" in text
    assert "| `zero/a.py: setup_context` | 1.00 | 20 | 2.50 | 20 | +1.50 |" in text
    assert "zero/b.py: new" not in text  # in one run's top list only
    # fetch and setup_context are called equally often: their ratios 1.2 and 2.5, median 1.85
    assert "(2) took a median 1.85 times as long" in text
    # ordered by the size of the difference
    assert text.index("a.py: hook") < text.index("a.py: fetch") < text.index("a.py: setup_context")


def test_paired_step_times_on_cpu(tmp_path):
    """--pair runs two variants in long-lived processes taking turns; the same tree and variant on
    both sides trains to the same warm-up losses."""
    pytest.importorskip("peft")
    out = tmp_path / "pair.json"
    tree = os.path.dirname(os.path.dirname(__import__("deepspeed").__file__))
    proc = subprocess.run([
        sys.executable,
        str(BENCH), "--pair", f"a=series@{tree}", f"b=reentrant@{tree}", "--layers", "2", "--hidden", "256", "--seq",
        "32", "--batch", "2", "--warmup", "2", "--pairs", "4", "--block", "1", "--out",
        str(out)
    ],
                          env=dict(os.environ, DS_ACCELERATOR="cpu"),
                          capture_output=True,
                          text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert [len(result["blocks"][label]) for label in ("a", "b")] == [4, 4]
    assert result["stamp"]["series"] == "v0.19.2" and result["stamp"]["command"] == "scripts/bench_lifecycle.py --pair"
    assert result["ready"][0]["warmup_losses"] == pytest.approx(result["ready"][1]["warmup_losses"])
    assert "b - a, per pair" in proc.stdout and "mean of the per-pair ratios" in proc.stdout
    bad = subprocess.run([sys.executable, str(BENCH), "--pair", "a=nosuch@x", f"b=series@{tree}"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "expected LABEL=VARIANT@TREE" in bad.stderr
    too_few = subprocess.run(
        [sys.executable, str(BENCH), "--pair", f"a=series@{tree}", f"b=series@{tree}", "--pairs", "2"],
        capture_output=True, text=True, timeout=120)
    assert too_few.returncode != 0 and "--pairs must be at least 4" in too_few.stderr
