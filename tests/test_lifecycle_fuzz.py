"""The lifecycle fuzzer's bounded run (tests/lifecycle_fuzz.py): a fixed seed and a fixed number of
drawn models, each trained under ZeRO-3 on 2 ranks against a plain torch reference.

On a tree that lacks part of the series (``tox -e pristine``: ZERO3_SERIES_PREFIX=0) the same cases
must find the bugs the series fixes: the crash and the leaks. That is the proof that the search can
find bugs at all. The expectation lives here, not in the fuzzer, which checks the invariants of
whatever DeepSpeed is installed. Regression cases the fuzzer found go at the end.
"""

import os

import pytest

from tests import lifecycle_fuzz
from tests.test_frozen_ckpt import SERIES_LENGTH, applied_patches

# Cases of the bounded run. Measured on 2 cores (see the commit): about 3 s per case.
BOUNDED_EXAMPLES = int(os.environ.get("ZERO3_FUZZ_EXAMPLES") or 40)


@pytest.fixture(scope="module")
def fuzz_pool(rank_pool):
    # a pool of its own: a failing case kills its ranks, and the drawn models register z3 leaf
    # flags and hooks on module instances only, but nothing else should share a failure's restart
    from tests.harness import RankPool
    pool = RankPool(rank_pool.world_size, name="fuzz")
    yield pool
    pool.close()


def run_case(pool, case):
    """Runs one case and raises the violation it finds (the form the fuzzer prints a failure in)."""
    found, _ = lifecycle_fuzz.check(pool, case)
    if found:
        lifecycle_fuzz.raise_violation(*found)


violation = lifecycle_fuzz.violation_class


def _nodes(case):
    stack = [case["model"]]
    while stack:
        node = stack.pop()
        stack.extend(node["children"])
        yield node


def _may_feed_no_grad_input(case):
    """Whether some module may get inputs of which none requires grad: the model input needs no
    grad, or a leaf output (computed from a detached input) feeds a child."""
    return not case["inputs"]["x_grad"] or any(node["output"] == "leaf" for node in _nodes(case))


def _unused_trainable(node):
    used = {op[0] for op in node["ops"]}
    return (node["params"]["w"] == "trainable" and "linear" not in used) or (node["params"]["s"] == "trainable"
                                                                             and "scale" not in used)


def known_finding(case):
    """The open finding of the v0.19.2 series that ``case`` would find again, or None: the bounded
    run does not run those cases, so that it fails only on new findings. Each has its shrunk case
    as an xfail(strict=True) test below. The predicates over-approximate (they skip some cases that
    would pass), never the reverse."""
    nodes = list(_nodes(case))
    if any(node["z3_leaf"] and node["output"] == "dict" for node in nodes):
        return "z3-leaf-dict-output"
    if any(node["z3_leaf"] for node in nodes) and (case["forwards"] > 1 or any(
            op[0] == "child" and op[3] > 1 for node in nodes for op in node["ops"])):
        return "z3-leaf-run-twice"
    modes = {op[2] for node in nodes for op in node["ops"] if op[0] == "child" and node["children"]}
    recompute_runs_post_forward = "function-relu" in modes or (not case["early_stop"] and modes & {"module", "function"})
    if recompute_runs_post_forward and any(node["params"]["w"] == "trainable" for node in nodes):
        return "trainable-weight-released-in-recompute"
    if any(node["output"] == "leaf" for node in nodes):
        return "input-cut-by-detach"
    if _may_feed_no_grad_input(case):
        if any(node["z3_leaf"] for node in nodes):
            return "z3-leaf-no-grad-input"
        if any(_unused_trainable(node) for node in nodes):
            return "unused-trainable-no-grad-input"
    return None


@pytest.mark.invariants("I1", "I7", "I8", "I10")
def test_drawn_models_keep_the_lifecycle_invariants(fuzz_pool, capsys):
    """Every drawn case: no error the reference does not raise, exact fp32 gradients, quiescence
    after every backward and step, the counter never negative, FWD_MODULE_STACK bounded, and the
    frozen all-gather volume of the run without checkpointing where the RFC promises it (I10).
    Cases of known findings (known_finding) are not run. On a tree without the series: the same
    cases, known findings included, find the crash and a leak."""
    if applied_patches() >= SERIES_LENGTH:
        stats = lifecycle_fuzz.Stats()
        try:
            lifecycle_fuzz.search(fuzz_pool, max_examples=BOUNDED_EXAMPLES, skip=known_finding, stats=stats)
        finally:
            with capsys.disabled():
                print(f"\nlifecycle fuzz (bounded): {stats.summary()}")
        return
    stats = lifecycle_fuzz.search(fuzz_pool, max_examples=BOUNDED_EXAMPLES, keep_going=True)
    with capsys.disabled():
        print(f"\nlifecycle fuzz (bounded, {applied_patches()} of {SERIES_LENGTH} patches): {stats.summary()}")
    missing = {"error", "I1"} - set(stats.failures)
    assert not missing, (f"the bounded search did not find {sorted(missing)} on a tree without the series, where "
                         f"the crash (error) and the leaks (I1) exist: {stats.summary()}")


# ----- findings of the fuzzer on the v0.19.2 series, shrunk by hypothesis ---------------------------
# Each fails on pristine v0.19.2 as well (the series does not fix it). Strict: once fixed, the xfail
# turns into a failure, and the case becomes a needs_patch(k) regression test.

_CASE = {
    "dim": 4,
    "inputs": {"x_grad": False, "aux": "none", "aux_grad": False},
    "forwards": 1,
    "early_stop": False,
    "zero": {"gas": 1, "prefetch": "0", "reuse": "0", "persistence": "0"},
    "steps": 2,
}


@pytest.mark.xfail(strict=True, raises=violation("error"),
                   reason="z3 leaf module fed an input that needs no grad: its weight is partitioned when its "
                   "backward runs (RuntimeError: size of tensor a (0) must match b (4)); v0.19.2 too")
def test_fuzz_z3_leaf_with_no_grad_input(fuzz_pool):
    run_case(fuzz_pool,
             dict(_CASE, model={"params": {"w": "trainable", "s": "trainable"}, "children": [],
                                "ops": [["linear"]], "output": "tensor", "z3_leaf": True}))


@pytest.mark.xfail(strict=True, raises=violation("grad"),
                   reason="z3 leaf module returning a dict: wrong gradient for its weight, silently, whether or "
                   "not its input requires grad; v0.19.2 too")
def test_fuzz_z3_leaf_dict_output_gradients(fuzz_pool):
    run_case(fuzz_pool,
             dict(_CASE, inputs={"x_grad": True, "aux": "none", "aux_grad": False},
                  model={"params": {"w": "trainable", "s": "none"}, "children": [], "ops": [["linear"]],
                         "output": "dict", "z3_leaf": True}))


@pytest.mark.xfail(strict=True, raises=violation("I1"),
                   reason="module fed an input that needs no grad, whose own trainable parameters its forward "
                   "does not use: 0003's post-backward trigger waits for their AccumulateGrad, which never runs; "
                   "its parameters stay gathered and the trigger armed after backward (v0.19.2: same leak)")
def test_fuzz_unused_trainable_params_with_no_grad_input(fuzz_pool):
    run_case(fuzz_pool,
             dict(_CASE, model={"params": {"w": "trainable", "s": "trainable"},
                                "children": [{"params": {"w": "trainable", "s": "trainable"}, "children": [],
                                              "ops": [["linear"]], "output": "tensor", "z3_leaf": False}],
                                "ops": [["child", 0, "none", 1, "none"]], "output": "tensor", "z3_leaf": False}))


@pytest.mark.xfail(strict=True, raises=violation("error"),
                   reason="z3 leaf module run twice before one backward (two forwards, one loss): the weight's "
                   "gradient enters the reduce bucket twice (AssertionError in __reduce_and_partition_ipg_grads, "
                   "len(set(ds_id)) == len(params)); v0.19.2 too")
def test_fuzz_z3_leaf_run_twice_before_backward(fuzz_pool):
    run_case(fuzz_pool,
             dict(_CASE, forwards=2, inputs={"x_grad": True, "aux": "none", "aux_grad": False},
                  model={"params": {"w": "trainable", "s": "trainable"}, "children": [], "ops": [["linear"]],
                         "output": "tensor", "z3_leaf": True}))


@pytest.mark.xfail(strict=True, raises=violation("I1"),
                   reason="module whose input requires grad but whose output does not depend on it (a child "
                   "computes from the detached input; its output is made to require grad by a hook): the "
                   "post-backward armed through the input never runs, so the module's trainable 'head' stays "
                   "gathered after backward (v0.19.2: same leak)")
def test_fuzz_input_cut_by_detach(fuzz_pool):
    run_case(fuzz_pool,
             dict(_CASE, inputs={"x_grad": True, "aux": "none", "aux_grad": False},
                  model={"params": {"w": "trainable", "s": "frozen"},
                         "children": [{"params": {"w": "trainable", "s": "frozen"}, "children": [],
                                       "ops": [["linear"]], "output": "tensor", "z3_leaf": False}],
                         "ops": [["child", 0, "none", 1, "none"], ["linear"]], "output": "leaf",
                         "z3_leaf": False}))


@pytest.mark.xfail(strict=True, raises=violation("error"),
                   reason="fully trainable: with set_checkpoint_early_stop(False) the recompute of a module-level "
                   "non-reentrant checkpoint runs the module's post-forward, which partitions the trainable weight "
                   "F.linear saved (RuntimeError: size of tensor a (0) must match b (4)); 0001 keeps only frozen "
                   "parameters; v0.19.2 too")
def test_fuzz_trainable_weight_released_in_recompute_without_early_stop(fuzz_pool):
    run_case(fuzz_pool,
             dict(_CASE, inputs={"x_grad": True, "aux": "none", "aux_grad": False},
                  model={"params": {"w": "none", "s": "none"},
                         "children": [{"params": {"w": "trainable", "s": "none"}, "children": [],
                                       "ops": [["linear"]], "output": "tensor", "z3_leaf": False}],
                         "ops": [["child", 0, "module", 1, "none"]], "output": "tensor", "z3_leaf": False}))
