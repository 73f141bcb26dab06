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
from tests.harness.pool import ScenarioFailed
from tests.scenarios.fuzz_case import may_run_a_module_twice, nodes, reads_a_z3_leaf_vector_externally
from tests.test_frozen_ckpt import SERIES_LENGTH, applied_patches

# Cases of the bounded run (1 to 3 s each on 2 cores). On a tree without the series twice as many:
# the first 40 find the leaks (I1, I7) but none of the crashes, which need a frozen parameter that a
# recompute partitions (measured: 80 cases find 8 errors, 17 I1, 41 I7 on pristine v0.19.2).
BOUNDED_EXAMPLES = int(os.environ.get("ZERO3_FUZZ_EXAMPLES") or 40)
PRISTINE_EXAMPLES = 2 * BOUNDED_EXAMPLES
VOLUME_EXAMPLES = 15  # each trains twice, with and without checkpointing


def run_case(pool, case):
    """Runs one case and raises the violation it finds (the form the fuzzer prints a failure in)."""
    found, _ = lifecycle_fuzz.check(pool, case)
    if found:
        lifecycle_fuzz.raise_violation(*found)


def run_fixed_case(pool, case, patch, *breaks):
    """Runs the shrunk case of a fixed finding: with fewer than ``patch`` patches of the installed
    base's series it must still break one of the invariants ``breaks``, with them hold them all."""
    if applied_patches() < patch:
        with pytest.raises(tuple(violation(tag) for tag in breaks)):
            run_case(pool, case)
        return
    run_case(pool, case)


violation = lifecycle_fuzz.violation_class


def finding_families(case):
    """The families of open findings whose shape ``case`` has, in the order a case is attributed to
    them. Each finding has its shrunk case as a test below. The predicates are deliberately broad
    (they skip cases that might pass) and describe the shape of each finding's family, not just
    its shrunk case."""
    tree = list(nodes(case))
    in_z3_leaves = [inner for node in tree if node["z3_leaf"] for inner in nodes({"model": node})]
    modes = {op[2] for node in tree for op in node["ops"] if op[0] == "child" and node["children"]}
    runs_twice = may_run_a_module_twice(case)
    # without early stop, or past the module (function-relu), the recompute runs its post-forward
    recompute_runs_post_forward = "function-relu" in modes or (not case["early_stop"]
                                                               and modes & {"module", "function"})
    families = {
        "z3-leaf-dict-output": any(node["output"] == "dict" for node in in_z3_leaves),
        "z3-leaf-run-twice": bool(in_z3_leaves) and runs_twice,
        "z3-leaf-external-param": reads_a_z3_leaf_vector_externally(case),
        "input-cut-by-reentrant-dict-output": "reentrant" in modes and any(node["output"] == "dict" for node in tree),
        "reentrant-module-run-twice": "reentrant" in modes and runs_twice,
        # a module fed an input that needs no grad, run twice, once under function-level checkpointing
        "no-grad-input-function-run-twice": (not case["inputs"]["x_grad"] and runs_twice
                                             and bool(modes & {"function", "function-relu"})),
        # a parameter read inside a reentrant checkpoint and outside it (another module's vector, read
        # as an external parameter): its gradient is accumulated by two backward calls
        "reentrant-external-param": "reentrant" in modes and any(op[0] == "external" for node in tree
                                                                 for op in node["ops"]),
        "trainable-weight-released-in-recompute": bool(recompute_runs_post_forward) and any(
            node["params"]["w"] == "trainable" for node in tree),
        "z3-leaf-leaf-output": any(node["output"] == "leaf" for node in in_z3_leaves),
        "input-cut-by-detach": any(node["output"] == "leaf" for node in tree),
        "checkpointed-param-output-run-twice": runs_twice and bool(modes & {"function", "function-relu"}) and any(
            node["output"] == "param" and node["params"]["s"] == "trainable" for node in tree),
        "volume-module-run-twice": (case["zero"]["reuse"] == "0" and case["inputs"]["x_grad"]
                                    and bool(modes - {"none", "reentrant"}) and runs_twice),
        # a z3 leaf with no backward (its output needs no grad: frozen or unused params, an input that
        # needs none) under the default reuse distance; its output cannot be told from the case, so any
        # z3 leaf under that setting
        "z3-leaf-kept-by-reuse": case["zero"]["reuse"] == "default" and bool(in_z3_leaves),
        # reentrant checkpointing and a hook-made leaf output anywhere in the case
        "reentrant-leaf-output": "reentrant" in modes and any(node["output"] == "leaf" for node in tree),
        # a z3 leaf and function-level checkpointing anywhere in the case
        "z3-leaf-function-checkpoint": bool(in_z3_leaves) and bool(modes & {"function", "function-relu"}),
        # a module run under function-level and under reentrant checkpointing in one forward
        "function-and-reentrant-run-twice": bool(modes & {"function", "function-relu"}) and "reentrant" in modes
        and runs_twice,
        # a module whose output the loss does not use (a later module reads it detached: a hook-made leaf
        # output), recomputed by non-reentrant checkpointing while it holds a frozen parameter
        "output-unused-under-recompute": bool(modes & {"module", "function", "function-relu"}) and any(
            node["output"] == "leaf" for node in tree) and any("frozen" in node["params"].values() for node in tree),
    }
    return [family for family, matches in families.items() if matches]


# The open findings of each series. On the v0.19.8 follow-up, every shrunk case below was run
# (installed tree, 2 ranks on CPU): the input-cut families hold there (release_backward_leftovers
# sweeps at the end of backward what no post-backward released; on the v0.19.2 series 0007 runs
# such a module's post-backward at the end of the graph task), so does a z3 leaf fed an input that
# needs no grad (PR 6), and a child under no_grad that returns its input (PR 7, 0008 of the v0.19.2
# series); the other z3 leaf findings and both reentrant run-twice findings break as on the v0.19.2
# series, and so did the checkpointed param output and a z3 leaf's dict output, which 0012 and PR 10,
# 0013 and PR 11 fix. A trainable weight released by a recompute without early
# stop broke on both; 0009 and PR 8 fix it.
# Two families were open on the follow-up only (found by tox -e fuzz-v0198; the v0.19.2 series holds
# test_fuzz_volume_module_run_twice_plain_then_checkpointed, and meets the other as
# input-cut-by-detach): "z3-leaf-leaf-output", a z3 leaf whose output a hook makes a leaf: wrong
# gradient for its trainable weight, pristine v0.19.8 too (shrunk: the root is the z3 leaf, w and s
# trainable, ops [linear], output leaf, x_grad, prefetch 0, reuse 0); "volume-module-run-twice": 112
# bytes of frozen parameters all-gathered per step with checkpointing, 96 without (pristine v0.19.8
# breaks I8 first). The second was v0.19.8's one post-backward per module, not per invocation: the
# run without checkpointing kept the child gathered through the rest of backward (fewer gathers),
# the recompute reset the count and released it. PR 15 ports 0003 (128 and 128 bytes). A third family broke both series and pristine v0.19.8 (pristine v0.19.2 leaks
# another parameter first): "z3-leaf-kept-by-reuse", a z3 leaf with no backward (a frozen weight,
# found by a tox -e fuzz-v0198 search; trainable params its forward does not use, or a call under
# no_grad, found on the v0.19.2 series once 0010 let z3 leaf cases run there) kept its params
# gathered after backward from step 1 on under the default reuse distance; 0011 and PR 9 fix it
# (test_fuzz_z3_leaf_kept_by_reuse below and in tests/test_v0198.py).
# "reentrant-external-param", open on both series and on pristine v0.19.2 and v0.19.8 (found by the
# 30-minute search of the twelve-patch v0.19.2 series): a child checkpointed with use_reentrant=True
# reads its parent's vector, which the parent also uses outside the checkpoint; ZeRO-3 puts that
# vector's gradient in the reduce bucket twice (test_fuzz_reentrant_external_param below).
# The same search found "no-grad-input-function-run-twice", on the v0.19.2 series only: a
# trainable child fed an input that needs no grad, called first under function-level checkpointing
# and then plainly, crashed in backward (RuntimeError, the child's weight read partitioned). 0007
# turned a leak into that crash (prefix 6 leaves the head gathered, pristine v0.19.2 breaks I7
# first); 0007 now leaves a caller holding a released external parameter to the end of the graph
# task (test_fuzz_no_grad_input_function_run_twice below). The v0.19.8 follow-up passed throughout.
# The v0.19.2 series kept one broad family, "z3-leaf" (any z3 leaf), while a z3 leaf fed an input
# that needs no grad crashed there; 0010 (PR 6's change) fixed that, and the narrower z3 leaf
# families of the follow-up replaced it.
# Three families put one param's gradient into stage 3's reduction twice in one backward, on both
# series and on pristine v0.19.2 and v0.19.8: "z3-leaf-run-twice", "reentrant-module-run-twice" and
# "reentrant-external-param" (AssertionError in the reduce bucket; a wrong gradient, silently, once
# the first was partitioned). 0014 and PR 12 add the second reduction (test_fuzz_param_reduced_twice
# below and in tests/test_v0198.py); the fuzzer now also draws a reduce bucket of one element.
# "z3-leaf-leaf-output" is open on both series (test_fuzz_z3_leaf_output_cut_from_inputs below): its
# other shape, an input that needs no grad and a hook-made leaf output, and a dict output whose params
# the forward does not use (found by the 30-minute search of the fifteen-patch series) ran the leaf's
# reduction before any pre-backward gathered it, which zero-filled the params at their partitioned
# size; 0010 and PR 6 zero-fill at the full size. "z3-leaf-external-param" counts only cases where a
# module reads, as an external parameter, the vector of a module inside a z3 leaf, or reads one from
# inside a z3 leaf (reads_a_z3_leaf_vector_externally); any external read next to any z3 leaf kept
# two thirds of the cases out of that search.
# Two families found by the 30-minute search of series-15 (0682f71f4179), on both series (pristine
# v0.19.2 and v0.19.8 break I7 or raise first): "z3-leaf-function-checkpoint", a z3 leaf child called
# under function-level checkpointing, got a wrong gradient for its weight (fixed, below);
# "unused-frozen-param-function-checkpoint", a frozen vector that its module's forward does not use,
# in a child called under function-level checkpointing, is all-gathered 32 bytes per step without
# checkpointing and not at all with it. That one was the oracle's: a forward called as a function
# gathers only what it reads, and the run without checkpointing called the child as a module. It now
# calls the forward as a function too (fuzz_lifecycle.without_checkpointing), and both gather nothing
# (test_fuzz_volume_forward_skipping_a_frozen_param).
# Three z3 leaf families had one cause, a leaf whose full backward hook torch does not call:
# "z3-leaf-function-checkpoint", "z3-leaf-leaf-output" and "z3-leaf-external-param". 0015 reduces
# such a leaf's grads in the backward epilogue, PR 13 on the follow-up
# (test_fuzz_z3_leaf_grads_reduced_without_backward_hook); the fuzzer draws all three shapes again.
# "reentrant-leaf-output", found by the 30-minute fuzz-v0198 search of follow-up-12 (cc7a3cadabd7),
# failed the same way on both series and on pristine v0.19.2 and v0.19.8: a child whose output a hook
# makes a leaf, checkpointed with use_reentrant=True by a parent that also scales with its own vector,
# raised AttributeError ('NoneType' object has no attribute 'numel') in backward. Torch ran the
# vector's grad hook with no grad; 0016 and PR 14 reduce zeros there (test_fuzz_reentrant_leaf_output).
# "output-unused-under-recompute", found by the 20-minute search of series-17 (3a936b69e4d6), the same
# on series-15's fixes (the first fourteen patches): a module whose output the loss does not use (the
# next module reads it detached) and that holds a frozen parameter is recomputed under module-level
# checkpointing; its post-backward never runs, so the frozen parameter the recompute held is released
# at the end of the graph task, with the late-release report (I4; an error under strict release
# checks). 0017 releases it at the recompute's post-forward when no node of the module's original
# outputs is left, the weak references of 0007 letting the unused input's graph go
# (test_fuzz_output_unused_under_recompute, once a strict xfail). A module whose unused output is
# kept alive (returned, stored) is still held and reported: torch checks what that graph saved.
# "returned-param-after-grads-accumulated", found 8 minutes into a search of series-18 (on pristine
# v0.19.2 too; the follow-up's epilogue sweep releases it): a module fed an input that needs no grad,
# trainable params only, returning its child's output and its own vector and not using its weight,
# was gathered again by the pre-backward of the child's output after its post-backward had run (the
# returned vector's accumulator fired it first), and stayed gathered (I1). 0018 gathers nothing once
# the trigger has fired (test_fuzz_returned_param_after_grads_accumulated).
# "function-and-reentrant-run-twice", found by the 30-minute search of series-19 (76ce9e61342b), there
# on series-17 too, not on the follow-up (pristine v0.19.2 breaks I7 and I1 first): a child called
# first under function-level checkpointing, checkpoint(kid.forward), then under use_reentrant=True
# checkpointing, below a root that reads its input detached (so that no input of the tree needs grad),
# fails in step 1 with its weight partitioned ("size mismatch ... vec (0)"); with the root's input
# attached it passes. The caller's trigger (0007) counted the child's weight accumulated by the
# reentrant checkpoint's nested backward; it now counts the graph task of its own invocation's
# pre-backward and only records earlier runs (test_fuzz_function_and_reentrant_run_twice, once a
# strict xfail; review findings of the same kind: test_trigger_counts_its_own_invocation_backward).
# "trigger-armed-by-recompute", found 9 minutes into the 30-minute search of that fix (05300e7), on
# series-19 too: a child fed an input that needs no grad, checkpointed at module level without the
# early stop, whose trigger had fired (or could not fire) before the recompute ran its post-forward
# again: that armed a new trigger on the recomputed outputs, whose backward torch never runs, and
# it stayed armed after backward (I1). 0007 settles a trigger that a recompute armed at the end of
# that graph task (test_fuzz_trigger_armed_by_recompute). The same search found an oracle problem:
# gradients under reentrant checkpointing are sums in another order than the reference's also without
# gradient accumulation (test_fuzz_reentrant_gradient_summed_in_another_order).
# "no-grad-call-in-recompute", found 4 minutes into the 30-minute search of series-19b (026476556ed3),
# on series-19, pristine v0.19.2 and pristine v0.19.8 too, not on the follow-up: a module that runs a
# child plainly and then under torch.no_grad, below a module-level checkpoint without the early stop.
# The recompute's call with grad kept the child's weight for its backward, the no_grad call after it
# released the module's claim and partitioned the weight (RuntimeError, size 0). 0019 leaves what the
# ledger holds for a module to that hold (test_fuzz_no_grad_call_in_recompute).
# "frozen-param-returned-through-function", found 25 minutes into the same search, on series-19 and
# on the follow-up too: a child called through its forward function under non-reentrant
# checkpointing, checkpoint(kid.forward), that returns its own frozen vector all-gathered 32 frozen
# bytes per step where the run without checkpointing gathered 16. The oracle's again: that run called
# the child as a module, whose post-forward marks a returned parameter external, which
# release_sub_module never releases, so it stays gathered until the step ends; called as a function
# nothing marks it, and kid.forward(h) without checkpointing gathers 32 bytes too
# (test_fuzz_frozen_param_returned_through_function).
OPEN_FINDINGS = {
    "v0.19.2": (),
    "v0.19.8": (),
}


def known_finding(case):
    """The open finding of the v0.19.2 series that ``case`` may find again, or None: the bounded
    run does not run those cases, so that it fails on new findings only."""
    return next((f for f in finding_families(case) if f in OPEN_FINDINGS["v0.19.2"]), None)


def known_finding_v0198(case):
    """The same for the v0.19.8 follow-up series (``tox -e fuzz-v0198``)."""
    return next((f for f in finding_families(case) if f in OPEN_FINDINGS["v0.19.8"]), None)


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
    stats = lifecycle_fuzz.search(fuzz_pool, max_examples=PRISTINE_EXAMPLES, keep_going=True)
    with capsys.disabled():
        print(f"\nlifecycle fuzz (bounded, {applied_patches()} of {SERIES_LENGTH} patches): {stats.summary()}")
    missing = {"error", "I1"} - set(stats.failures)
    assert not missing, (f"the bounded search did not find {sorted(missing)} on a tree without the series, where "
                         f"the crash (error) and the leaks (I1) exist: {stats.summary()}")


@pytest.mark.needs_patch(1)
@pytest.mark.invariants("I10")
def test_drawn_models_keep_the_frozen_gather_volume(fuzz_pool, request, capsys):
    """Cases drawn so that I10 applies to every one (lifecycle_fuzz.VOLUME_CKPT): with non-reentrant
    checkpointing, the frozen all-gather volume per step equals that of the same case without
    checkpointing (and every other invariant holds). Known findings are not run. v0.19.2 fails."""
    if applied_patches() < 1:
        stats = lifecycle_fuzz.search(fuzz_pool, max_examples=VOLUME_EXAMPLES, volume=True, keep_going=True)
        with capsys.disabled():
            print(f"\nlifecycle fuzz (bounded, I10, {applied_patches()} of {SERIES_LENGTH} patches): {stats.summary()}")
        assert stats.failures, f"the volume cases found nothing on a tree without the series: {stats.summary()}"
        return
    stats = lifecycle_fuzz.Stats()
    try:
        lifecycle_fuzz.search(fuzz_pool, max_examples=VOLUME_EXAMPLES, skip=known_finding, stats=stats, volume=True)
    finally:
        with capsys.disabled():
            print(f"\nlifecycle fuzz (bounded, I10): {stats.summary()}")
    assert stats.volume_checked, "no case checked the volume"


# ----- findings of the fuzzer on the v0.19.2 series, shrunk by hypothesis ---------------------------
# An open finding is its paste-ready test (lifecycle_fuzz.paste_ready) under @finding, a strict xfail;
# none is open now. Once fixed, the xfail turns into a failure, and the case becomes a needs_patch(k)
# regression test (or a needs_patch(0) guard where v0.19.2 passes too). Findings are on the whole
# series: a tree with fewer patches skips them (all fail on pristine v0.19.2 too, some with another
# invariant first).


def finding(tag, reason):
    if applied_patches() < SERIES_LENGTH:
        return pytest.mark.skip(reason=f"a finding on the whole series, not on a prefix: {reason}")
    return pytest.mark.xfail(strict=True, raises=violation(tag), reason=reason)


_CASE = {
    "dim": 4,
    "inputs": {"x_grad": False, "aux": "none", "aux_grad": False},
    "forwards": 1,
    "early_stop": False,
    "zero": {"gas": 1, "prefetch": "0", "reuse": "0", "persistence": "0"},
    "steps": 2,
}
_TRAINABLE_LEAF = {"params": {"w": "trainable", "s": "trainable"}, "children": [], "ops": [["linear"]],
                   "output": "tensor", "z3_leaf": False}


def _node(ops, children=(), w="trainable", s="trainable", output="tensor"):
    """A drawn-model node (tests/scenarios/fuzz_lifecycle.py), not a z3 leaf."""
    return {"params": {"w": w, "s": s}, "children": list(children), "ops": ops, "output": output, "z3_leaf": False}


@pytest.mark.needs_patch(10)
@pytest.mark.invariants("I1", "I2")
def test_fuzz_z3_leaf_with_no_grad_input(fuzz_pool):
    """Once a finding: a z3 leaf root, fully trainable, fed an input that needs no grad. Torch fired
    the leaf's full backward hook before the leaf's backward, and the reduction it runs zero-filled
    the partitioned weight's grad, into which AccumulateGrad then failed to add the real one
    (RuntimeError: size of tensor a (0) must match b (4)). 0010 reduces after the last accumulation.
    v0.19.2 and every prefix without 0010 fail the same way; v0.19.8 too (its PR 6 is the same fix)."""
    case = dict(_CASE, model={"params": {"w": "trainable", "s": "trainable"}, "children": [],
                              "ops": [["linear"]], "output": "tensor", "z3_leaf": True})
    if applied_patches() < 10:
        with pytest.raises(violation("error")):
            run_case(fuzz_pool, case)
        return
    run_case(fuzz_pool, case)


@pytest.mark.needs_patch(10)
@pytest.mark.invariants("I1")
def test_fuzz_z3_leaf_leaf_output_no_grad_child(fuzz_pool):
    """Once a finding (the 30-minute search of the fourteen-patch series, once the input-cut families
    no longer hid leaf outputs): a z3 leaf root fed an input that needs no grad, whose output a hook
    makes a leaf, calling a trainable child under torch.no_grad. No grad of the leaf's params is
    reached, so its reduction ran at once, before any pre-backward gathered them, and zero-filled
    them at their partitioned size (RuntimeError: 0 != 16 Cannot reduce scatter gradients whose
    size is not same as the params). 0010 zero-fills at the full size. v0.19.2 and every prefix
    before 0010 fail the same way."""
    run_fixed_case(fuzz_pool,
                   dict(_CASE,
                        model={"params": {"w": "trainable", "s": "trainable"},
                               "children": [{"params": {"w": "trainable", "s": "trainable"}, "children": [],
                                             "ops": [["linear"]], "output": "tensor", "z3_leaf": False}],
                               "ops": [["nograd", 0]], "output": "leaf", "z3_leaf": True}), 10, "error")


# the shrunk cases of three families whose z3 leaf's full backward hook torch never calls, so that
# nothing reduced the leaf's grads (tests/test_v0198.py runs them on v0.19.8): its forward called
# by function-level checkpointing ("z3-leaf-function-checkpoint", found by the 30-minute search of
# series-15), its output cut from its input by a detach ("z3-leaf-leaf-output", found by
# tox -e fuzz-v0198), and its vector read as an external parameter while it does not run
# ("z3-leaf-external-param")
_TRAINABLE_Z3_LEAF = dict(_TRAINABLE_LEAF, z3_leaf=True)
Z3_LEAF_HOOK_NOT_CALLED = {
    "forward-under-function-checkpoint":
    dict(_CASE,
         inputs={"x_grad": True, "aux": "none", "aux_grad": False},
         model={"params": {"w": "trainable", "s": "trainable"}, "children": [_TRAINABLE_Z3_LEAF],
                "ops": [["child", 0, "function", 1, "none"]], "output": "tensor", "z3_leaf": False}),
    "output-cut-from-input":
    dict(_CASE,
         inputs={"x_grad": True, "aux": "none", "aux_grad": False},
         model=dict(_TRAINABLE_Z3_LEAF, output="leaf")),
    "vector-read-while-idle":
    dict(_CASE,
         inputs={"x_grad": True, "aux": "none", "aux_grad": False},
         model={"params": {"w": "trainable", "s": "none"},
                "children": [dict(_TRAINABLE_LEAF, ops=[["external", 0]]), _TRAINABLE_Z3_LEAF],
                "ops": [["child", 0, "none", 1, "none"]], "output": "tensor", "z3_leaf": False}),
}


@pytest.mark.needs_patch(15)
@pytest.mark.invariants("I1")
@pytest.mark.parametrize("shape", Z3_LEAF_HOOK_NOT_CALLED)
def test_fuzz_z3_leaf_grads_reduced_without_backward_hook(fuzz_pool, shape):
    """Once findings: a trainable z3 leaf whose full backward hook torch does not call (its forward
    run by checkpoint(leaf.forward), its output cut from its input, or the leaf idle while another
    module reads its vector) got a wrong gradient, silently: its params' grads were never reduced.
    0015 reduces them in the backward epilogue. The fourteen-patch prefix gets the wrong gradients;
    pristine v0.19.2 too for the idle leaf, and breaks I7 (the checkpointed leaf: counter -16) or
    I1 (the cut output: the head left gathered) first in the other two shapes."""
    run_fixed_case(fuzz_pool, Z3_LEAF_HOOK_NOT_CALLED[shape], 15, "grad", "I7", "I1")


def run_experts_routed_by_rank(pool, patch):
    """The z3 leaf experts scenario (tests/scenarios/frozen_ckpt.py): with fewer than ``patch``
    patches of the installed base's series it must fail, with them pass."""
    target = "tests.scenarios.frozen_ckpt:z3_leaf_experts_routed_by_rank"
    if applied_patches() < patch:
        with pytest.raises(ScenarioFailed):
            pool.run(target)
        return
    pool.run(target)


@pytest.mark.needs_patch(15)
@pytest.mark.invariants("I1")
def test_z3_leaf_experts_routed_by_rank(fuzz_pool):
    """A z3 leaf of two experts whose backward hook torch never calls (its output is cut from its
    input), each rank routing to another expert: every rank must reduce both experts' params, or
    the ranks' reductions do not match. A reviewer's finding on the first version of 0015, which
    reduced only the params holding a grad (the experts' gradients averaged across experts); every
    prefix without 0015 never reduces them, pristine v0.19.2 too."""
    run_experts_routed_by_rank(fuzz_pool, 15)


# the shrunk case of "output-unused-under-recompute" (tests/test_v0198.py runs it on v0.19.8)
_DETACHED_READER = {"params": {"w": "trainable", "s": "trainable"}, "children": [], "ops": [["linear"]],
                    "output": "leaf", "z3_leaf": False}
_UNUSED_OUTPUT = {"params": {"w": "trainable", "s": "frozen"}, "children": [], "ops": [["linear"]],
                  "output": "tensor", "z3_leaf": False}
OUTPUT_UNUSED_UNDER_RECOMPUTE = dict(
    _CASE,
    inputs={"x_grad": True, "aux": "none", "aux_grad": False},
    model={"params": {"w": "trainable", "s": "trainable"},
           "children": [{"params": {"w": "trainable", "s": "trainable"}, "children": [_DETACHED_READER, _UNUSED_OUTPUT],
                         "ops": [["child", 0, "none", 1, "none"], ["child", 1, "none", 1, "none"],
                                 ["child", 0, "none", 1, "none"]],
                         "output": "tensor", "z3_leaf": False}],
           "ops": [["child", 0, "module", 1, "none"]], "output": "tensor", "z3_leaf": False})


@pytest.mark.needs_patch(17)
@pytest.mark.invariants("I4")
def test_fuzz_output_unused_under_recompute(fuzz_pool):
    """Once a finding (the 20-minute search of series-17): a module whose output the next module
    reads detached, holding a frozen vector, recomputed under module-level checkpointing: its
    post-backward never runs, and the recompute's hold was released only at the end of the graph
    task (late-release report). 0017 releases it at the recompute's post-forward, since no node of
    its original forward's outputs is left. The first sixteen patches break I4; pristine v0.19.2
    fails in backward (RuntimeError, a tensor of size 0)."""
    run_fixed_case(fuzz_pool, OUTPUT_UNUSED_UNDER_RECOMPUTE, 17, "I4", "error")


# the shrunk case of "returned-param-after-grads-accumulated"
RETURNED_PARAM_AFTER_GRADS_ACCUMULATED = dict(
    _CASE,
    model={"params": {"w": "trainable", "s": "trainable"}, "children": [_TRAINABLE_LEAF],
           "ops": [["child", 0, "none", 1, "none"]], "output": "param", "z3_leaf": False})


@pytest.mark.needs_patch(18)
@pytest.mark.invariants("I1")
def test_fuzz_returned_param_after_grads_accumulated(fuzz_pool):
    """Once a finding (8 minutes into a search of series-18, on pristine v0.19.2 too): a module
    fed an input that needs no grad, with trainable params only, returning its child's output and
    its own vector, and not using its weight. Its post-backward runs once its params' grads are
    accumulated; backward reached the returned vector first, so that the pre-backward of the
    child's output came after the post-backward and gathered the weight again, for good. 0018
    gathers nothing once the trigger has fired."""
    run_fixed_case(fuzz_pool, RETURNED_PARAM_AFTER_GRADS_ACCUMULATED, 18, "I1")


@pytest.mark.needs_patch(14)
@pytest.mark.invariants("I1", "I7")
def test_fuzz_function_and_reentrant_run_twice(fuzz_pool):
    """Once a finding (the 30-minute search of series-19): a caller fed an input that needs no grad
    calls a trainable child through its forward function under checkpointing, then as a module under
    use_reentrant=True checkpointing. From step 1 on the caller holds the child's weight as its
    external parameter at post-forward, so its post-backward trigger (0007) hooks the weight's
    accumulator, which first fires in the reentrant checkpoint's nested backward: post-backward
    released the weight there, and the function's recompute, later in the outer backward, read it
    partitioned (RuntimeError, size mismatch, vec (0)). The trigger now counts the accumulators of
    the graph task that runs its invocation's pre-backward. Every prefix before 0014 fails (the nested
    and the outer backward both reduce the child's weight: AssertionError in the reduce bucket, or
    this error); pristine v0.19.2 breaks I7 and I1."""
    caller = _node([["child", 0, "function", 1, "none"], ["child", 0, "reentrant", 1, "none"]], [_TRAINABLE_LEAF])
    middle = _node([["child", 0, "none", 1, "none"]], [caller])
    model = _node([["child", 0, "none", 1, "none"]], [middle], output="leaf")
    run_fixed_case(fuzz_pool, dict(_CASE, inputs={"x_grad": True, "aux": "none", "aux_grad": False}, model=model), 14,
                   "error", "I1", "I7")


@pytest.mark.needs_patch(9)
@pytest.mark.invariants("I1")
def test_fuzz_trigger_armed_by_recompute(fuzz_pool):
    """Once a finding (the 30-minute search of the function-and-reentrant fix, there on series-19
    too): a root that reads its input detached runs a child under module-level checkpointing
    without the early stop; the child runs a grandchild, and only the grandchild uses its weight.
    The child's pre-backward found that its trigger could not fire (its own parameters unused) and
    ran post-backward at the end of the graph task instead; the recompute, later in that backward,
    ran the child's post-forward again, which armed a new trigger on outputs whose backward torch
    never runs: still armed after backward (I1). Before 0009 the recompute partitions the
    grandchild's weight its own backward is about to use (RuntimeError, size 0); pristine v0.19.2
    fails the same way."""
    child = _node([["child", 0, "none", 1, "none"]], [_TRAINABLE_LEAF])
    model = _node([["child", 0, "module", 1, "none"]], [child], output="leaf")
    run_fixed_case(fuzz_pool, dict(_CASE, inputs={"x_grad": True, "aux": "none", "aux_grad": False}, model=model), 9,
                   "error", "I1")


def _no_grad_input_case(children, ops):
    """A root without parameters, fed an input that needs no grad, over ``children``."""
    return dict(_CASE,
                inputs={"x_grad": False, "aux": "none", "aux_grad": False},
                model={"params": {"w": "none", "s": "none"}, "children": children, "ops": ops, "output": "tensor",
                       "z3_leaf": False})


# Review findings on 0007's trigger (a module fed an input that needs no grad, trainable params only):
# an accumulator of its params that runs in a reentrant checkpoint's nested backward before the
# module's own pre-backward fired the trigger there; the module's backward, still to come in the
# outer graph task, then gathered nothing (0018) and read a vector partitioned (size 0).
TRIGGER_NESTED_FIRST = {
    # another module, checkpointed with use_reentrant=True, reads the vector as an external parameter
    "external-reader": _no_grad_input_case(
        [_node([["linear"], ["scale"]]),
         _node([["external", 0]], w="none", s="none")],
        [["child", 0, "none", 1, "none"], ["child", 1, "reentrant", 1, "none"]]),
    # the module itself runs again inside a reentrant checkpoint, armed through its input there
    "same-module": _no_grad_input_case([_node([["scale"], ["act", "tanh"], ["scale"]], w="none")],
                                       [["child", 0, "none", 1, "none"], ["child", 0, "reentrant", 1, "none"]]),
}

# Guards of the same trigger: an accumulator that runs in the module's graph task before its
# pre-backward (another module reads the vector the module does not use), and a module whose output
# the loss does not use (read detached) while its vector is read externally: no pre-backward will
# run, and the accumulator that does binds the trigger.
TRIGGER_EARLY_RUN_GUARDS = {
    "accumulated-before-pre-backward": _no_grad_input_case([_node([["linear"]])],
                                                           [["child", 0, "none", 1, "none"], ["external", 0]]),
    "output-unused": _no_grad_input_case(
        [_node([["linear"], ["scale"]]),
         _node([["act", "tanh"]], w="none", s="none", output="leaf")],
        [["child", 0, "none", 1, "none"], ["child", 1, "none", 1, "none"], ["external", 0]]),
}


@pytest.mark.needs_patch(14)
@pytest.mark.invariants("I1")
@pytest.mark.parametrize("shape", sorted(TRIGGER_NESTED_FIRST))
def test_trigger_counts_its_own_invocation_backward(fuzz_pool, shape):
    """Once review findings (series-19 and its first fix, both RuntimeError in step 0): the trigger
    counts the accumulators of the graph task that runs the pre-backward of an invocation it armed,
    and only records earlier runs elsewhere. Before 0014 the vector is reduced twice in one
    backward (AssertionError in the reduce bucket); pristine v0.19.2 too."""
    run_fixed_case(fuzz_pool, TRIGGER_NESTED_FIRST[shape], 14, "error")


@pytest.mark.needs_patch(7)
@pytest.mark.invariants("I1")
@pytest.mark.parametrize("shape", sorted(TRIGGER_EARLY_RUN_GUARDS))
def test_trigger_early_runs(fuzz_pool, shape):
    """Guards of 0007's trigger, which a first version of its graph-task binding broke (the trigger
    stayed armed, the module gathered): accumulators that run before any pre-backward binds it.
    Without 0007 the module is never released in backward (I1)."""
    run_fixed_case(fuzz_pool, TRIGGER_EARLY_RUN_GUARDS[shape], 7, "I1")


@pytest.mark.needs_patch(14)
@pytest.mark.invariants("I1")
def test_fuzz_reentrant_gradient_summed_in_another_order(fuzz_pool):
    """Once an oracle finding (the 30-minute search of the trigger-armed-by-recompute fix, on
    series-19 too; 1.5e-8 apart): a child checkpointed with use_reentrant=True, run twice in each of
    two forwards, gets its weight's gradient in parts, one per backward phase, which ZeRO-3 adds up
    as its buckets are reduced; the reference sums them in another order. Gradients under
    reentrant checkpointing are compared up to the rounding of that order. Before 0014 the parts
    cannot be added (AssertionError in the reduce bucket)."""
    child = _node([["child", 0, "reentrant", 1, "none"]], [_TRAINABLE_LEAF])
    model = _node([["child", 0, "none", 1, "none"], ["child", 0, "none", 1, "none"]], [child])
    run_fixed_case(
        fuzz_pool,
        dict(_CASE,
             inputs={"x_grad": True, "aux": "none", "aux_grad": False},
             forwards=2,
             zero=dict(_CASE["zero"], bucket="one-param"),
             model=model), 14, "error")


@pytest.mark.needs_patch(19)
@pytest.mark.invariants("I1")
def test_fuzz_no_grad_call_in_recompute(fuzz_pool):
    """Once a finding (the 30-minute search of series-19b): a module runs its child plainly and then
    under torch.no_grad, below a module-level checkpoint without the early stop. The child's
    backward starts the recompute, whose call with grad keeps the child's weight gathered for that
    backward; the no_grad call released it (RuntimeError, size 0). Every earlier prefix and pristine
    v0.19.2 fail the same way."""
    caller = _node([["child", 0, "none", 1, "none"], ["nograd", 0]], [_TRAINABLE_LEAF])
    middle = _node([["child", 0, "none", 1, "none"]], [caller])
    model = _node([["child", 0, "module", 1, "none"]], [middle])
    run_fixed_case(fuzz_pool, dict(_CASE, inputs={"x_grad": True, "aux": "none", "aux_grad": False}, model=model), 19,
                   "error")


# the shrunk case of "frozen-param-returned-through-function" (tests/test_v0198.py runs it on v0.19.8)
FROZEN_PARAM_RETURNED_THROUGH_FUNCTION = dict(
    _CASE,
    inputs={"x_grad": True, "aux": "none", "aux_grad": False},
    model=_node([["child", 0, "function", 1, "none"]], [_node([["linear"]], s="frozen", output="param")]))


@pytest.mark.invariants("I10")
def test_fuzz_frozen_param_returned_through_function(fuzz_pool):
    """Once a finding (the 30-minute search of series-19b), of the oracle: a child called under
    function-level checkpointing, checkpoint(kid.forward), that returns its own frozen vector
    all-gathered 32 frozen bytes per step, the same case without checkpointing 16, when that case
    called the child as a module. The module's post-forward marks the returned vector external,
    and release_sub_module never releases such a parameter: it stays gathered until the step ends.
    Called as a function, nothing marks it; the caller's post-forward releases it and its
    pre-backward gathers it again, and kid.forward(h) without checkpointing gathers the same 32
    bytes. The run without checkpointing now calls the forward as a function; the volumes must be
    equal. Pristine v0.19.2 breaks I7 first."""
    run_volume_case(fuzz_pool, FROZEN_PARAM_RETURNED_THROUGH_FUNCTION, pristine_breaks="I7")


# the shrunk case of "reentrant-leaf-output" (tests/test_v0198.py runs it on v0.19.8)
REENTRANT_LEAF_OUTPUT = dict(
    _CASE,
    inputs={"x_grad": True, "aux": "none", "aux_grad": False},
    model={"params": {"w": "trainable", "s": "trainable"},
           "children": [{"params": {"w": "trainable", "s": "trainable"}, "children": [_TRAINABLE_LEAF],
                         "ops": [["child", 0, "none", 1, "none"]], "output": "leaf", "z3_leaf": False}],
           "ops": [["scale"], ["child", 0, "reentrant", 1, "none"]], "output": "tensor", "z3_leaf": False})


@pytest.mark.needs_patch(16)
@pytest.mark.invariants("I1")
def test_fuzz_reentrant_leaf_output(fuzz_pool):
    """Once a finding (the 30-minute fuzz-v0198 search of the twelve-PR follow-up): a child whose
    output a hook makes a leaf (its forward reads its input detached), checkpointed with
    use_reentrant=True by a parent that scales with its own vector. The checkpoint returns None for
    its input, torch still runs the vector's post-accumulate-grad hook, and the reduction found no
    grad (AttributeError: 'NoneType' object has no attribute 'numel'). 0016 reduces zeros there.
    Every prefix without it fails the same way, pristine v0.19.2 too."""
    run_fixed_case(fuzz_pool, REENTRANT_LEAF_OUTPUT, 16, "error")


# the shrunk case of "z3-leaf-dict-output" (tests/test_v0198.py runs it on v0.19.8)
Z3_LEAF_DICT_OUTPUT = dict(_CASE,
                           inputs={"x_grad": True, "aux": "none", "aux_grad": False},
                           model={"params": {"w": "trainable", "s": "none"}, "children": [], "ops": [["linear"]],
                                  "output": "dict", "z3_leaf": True})
# ... and one whose params its forward does not use (a guard; tests/test_v0198.py runs it too)
Z3_LEAF_DICT_OUTPUT_PARAMS_UNUSED = dict(Z3_LEAF_DICT_OUTPUT,
                                         model=dict(Z3_LEAF_DICT_OUTPUT["model"],
                                                    params={"w": "trainable", "s": "trainable"},
                                                    ops=[["act", "tanh"]]))


@pytest.mark.needs_patch(13)
@pytest.mark.invariants("I1")
def test_fuzz_z3_leaf_dict_output_gradients(fuzz_pool):
    """Once a finding: a z3 leaf module returning a dict got a wrong gradient for its weight,
    silently, whether or not its input requires grad: torch never calls the full backward hook
    that reduces a z3 leaf's grads unless the output is a Tensor or a tuple. 0013 arms the
    reduction from the output's tensors. v0.19.2 and every prefix before 0013 fail the same way;
    v0.19.8 too, where PR 11 is the same change."""
    run_fixed_case(fuzz_pool, Z3_LEAF_DICT_OUTPUT, 13, "grad")


@pytest.mark.needs_patch(0)
@pytest.mark.invariants("I1")
def test_fuzz_z3_leaf_dict_output_params_unused(fuzz_pool):
    """A guard, once a finding (the 30-minute search of the fifteen-patch series): a z3 leaf returning
    a dict whose forward uses none of its trainable params. The reduction 0013 arms found no grad to
    wait for and ran at once, before any pre-backward gathered the leaf, zero-filling its params at
    their partitioned size (RuntimeError: 0 != 16 Cannot reduce scatter gradients whose size is not
    same as the params); 0010 now zero-fills at the full size. Without 0013 nothing reduces such a
    leaf and its params keep the zero grads they started with, so v0.19.2 and every prefix pass."""
    run_case(fuzz_pool, Z3_LEAF_DICT_OUTPUT_PARAMS_UNUSED)


@pytest.mark.needs_patch(7)
@pytest.mark.invariants("I1", "I5")
def test_fuzz_unused_trainable_params_with_no_grad_input(fuzz_pool):
    """Once a finding: a module fed an input that needs no grad, whose forward does not use its own
    trainable parameters (only its child's). 0007's post-backward trigger waited for their
    AccumulateGrad, which this backward never runs, so the parameters stayed gathered and the
    trigger armed (I1); the module's pre-backward now sees that and runs post-backward at the end
    of the graph task. v0.19.2 and the prefixes without 0007: the same leak."""
    case = dict(_CASE,
                model={"params": {"w": "trainable", "s": "trainable"},
                       "children": [{"params": {"w": "trainable", "s": "trainable"}, "children": [],
                                     "ops": [["linear"]], "output": "tensor", "z3_leaf": False}],
                       "ops": [["child", 0, "none", 1, "none"]], "output": "tensor", "z3_leaf": False})
    if applied_patches() < 7:
        with pytest.raises(violation("I1")):
            run_case(fuzz_pool, case)
        return
    run_case(fuzz_pool, case)


# The shrunk cases of the three families of a param reduced twice in one backward (tests/test_v0198.py
# runs them on v0.19.8). The reentrant ones also run with a reduce bucket of one element, where the
# second gradient meets the first already partitioned: no error there, a wrong gradient. (The z3 leaf
# run twice passes on v0.19.2 with that bucket: its first reduction, made before autograd accumulates
# the grads of both runs, is of zeros, and the second, of the sum, overwrites it.)
REDUCED_TWICE = {
    "z3-leaf-run-twice":
    dict(_CASE, forwards=2, inputs={"x_grad": True, "aux": "none", "aux_grad": False},
         model={"params": {"w": "trainable", "s": "trainable"}, "children": [], "ops": [["linear"]],
                "output": "tensor", "z3_leaf": True}),
    "reentrant-module-run-twice":
    dict(_CASE, inputs={"x_grad": True, "aux": "none", "aux_grad": False},
         model={"params": {"w": "trainable", "s": "trainable"},
                "children": [{"params": {"w": "trainable", "s": "trainable"}, "children": [_TRAINABLE_LEAF],
                              "ops": [["child", 0, "reentrant", 1, "none"]], "output": "tensor",
                              "z3_leaf": False}, _TRAINABLE_LEAF],
                "ops": [["child", 0, "none", 1, "none"], ["child", 0, "none", 1, "none"]],
                "output": "tensor", "z3_leaf": False}),
    "reentrant-external-param":
    dict(_CASE, inputs={"x_grad": True, "aux": "none", "aux_grad": False},
         model={"params": {"w": "trainable", "s": "trainable"},
                "children": [{"params": {"w": "trainable", "s": "trainable"}, "children": [],
                              "ops": [["external", 0]], "output": "tensor", "z3_leaf": False}],
                "ops": [["scale"], ["child", 0, "reentrant", 1, "none"]], "output": "tensor",
                "z3_leaf": False}),
}


REDUCED_TWICE_RUNS = [(family, "default") for family in REDUCED_TWICE] + [
    ("reentrant-module-run-twice", "one-param"), ("reentrant-external-param", "one-param")]


def with_bucket(case, bucket):
    return dict(case, zero=dict(case["zero"], bucket=bucket))


@pytest.mark.needs_patch(14)
@pytest.mark.invariants("I1")
@pytest.mark.parametrize("family, bucket", REDUCED_TWICE_RUNS)
def test_fuzz_param_reduced_twice(fuzz_pool, family, bucket):
    """Once findings (the 30-minute searches of the twelve- and fourteen-patch series, shrunk): a
    param whose gradient reaches stage 3's reduction twice in one backward: a z3 leaf run twice
    before one backward, a module run twice whose forward checkpoints its child with
    use_reentrant=True, a reentrant checkpoint reading its caller's vector that the caller also uses
    outside it. With the first gradient still in the reduce bucket, AssertionError in
    __reduce_and_partition_ipg_grads (len(set(ds_id)) == len(params)); with it already partitioned
    (a bucket of one element), micro-step 0 overwrote it: a wrong gradient, silently. 0014 adds the
    second reduction. v0.19.2 and every prefix before 0014 fail; v0.19.8 too, where PR 12 is the
    same change."""
    run_fixed_case(fuzz_pool, with_bucket(REDUCED_TWICE[family], bucket), 14, "error", "grad")


@pytest.mark.needs_patch(7)
@pytest.mark.invariants("I1")
def test_fuzz_input_cut_by_detach(fuzz_pool):
    """Once a finding: a module whose input requires grad but whose output does not depend on it (a
    child computes from the detached input; a hook makes its output require grad). Its post-backward
    counts down the grads of its inputs, which never come; its trainable 'head' stayed gathered after
    backward. 0007's pre-backward asks torch whether the graph task runs the nodes that count them
    down and, if not, runs post-backward at the end of the graph task."""
    run_fixed_case(fuzz_pool,
                   dict(_CASE, inputs={"x_grad": True, "aux": "none", "aux_grad": False},
                        model={"params": {"w": "trainable", "s": "frozen"},
                               "children": [{"params": {"w": "trainable", "s": "frozen"}, "children": [],
                                             "ops": [["linear"]], "output": "tensor", "z3_leaf": False}],
                               "ops": [["child", 0, "none", 1, "none"], ["linear"]], "output": "leaf",
                               "z3_leaf": False}), 7, "I1")


@pytest.mark.needs_patch(9)
@pytest.mark.invariants("I1", "I2")
def test_fuzz_trainable_weight_released_in_recompute_without_early_stop(fuzz_pool):
    """Once a finding: fully trainable, set_checkpoint_early_stop(False), a child checkpointed at
    module level whose forward is one F.linear on its own weight. The recompute starts inside the
    child's backward, after its pre-backward gathered the weight, and runs on through its
    post-forward, which partitioned the weight before its gradient was accumulated (RuntimeError:
    size of tensor a (0) must match b (4)). 0009 keeps it until the child's post-backward.
    v0.19.2 and every prefix without 0009 fail the same way; v0.19.8 too, where PR 8 is the same change."""
    case = dict(_CASE, inputs={"x_grad": True, "aux": "none", "aux_grad": False},
                model={"params": {"w": "none", "s": "none"},
                       "children": [{"params": {"w": "trainable", "s": "none"}, "children": [],
                                     "ops": [["linear"]], "output": "tensor", "z3_leaf": False}],
                       "ops": [["child", 0, "module", 1, "none"]], "output": "tensor", "z3_leaf": False})
    if applied_patches() < 9:
        with pytest.raises(violation("error")):
            run_case(fuzz_pool, case)
        return
    run_case(fuzz_pool, case)


@pytest.mark.needs_patch(0)
@pytest.mark.invariants("I1")
def test_fuzz_trainable_param_output_under_no_grad(fuzz_pool):
    """A guard, once a finding: a module run under torch.no_grad (nested in another no_grad module)
    that returns its own trainable parameter. The 4-patch v0.19.2 series armed a post-backward
    trigger for it (an output requires grad) whose AccumulateGrad never runs, so the trigger stayed
    armed after backward (I1). v0.19.2 passes, and so does the 8-patch series."""
    run_case(fuzz_pool,
             dict(_CASE, inputs={"x_grad": True, "aux": "none", "aux_grad": False},
                  model={"params": {"w": "none", "s": "frozen"},
                         "children": [{"params": {"w": "none", "s": "trainable"}, "children": [],
                                       "ops": [["act", "tanh"]], "output": "tensor", "z3_leaf": False},
                                      {"params": {"w": "none", "s": "none"},
                                       "children": [{"params": {"w": "trainable", "s": "trainable"}, "children": [],
                                                     "ops": [["linear"], ["scale"]], "output": "param",
                                                     "z3_leaf": False}],
                                       "ops": [["nograd", 0]], "output": "tensor", "z3_leaf": False}],
                         "ops": [["nograd", 1]], "output": "tensor", "z3_leaf": False}))


@pytest.mark.needs_patch(7)
@pytest.mark.invariants("I1")
def test_fuzz_reentrant_dict_output_cuts_input(fuzz_pool):
    """Once a finding, of the family of test_fuzz_input_cut_by_detach: a child under reentrant
    checkpointing returns a dict, which torch's CheckpointFunction passes on without autograd history,
    so the caller's output does not depend on its input; the caller's trainable 'head' stayed
    gathered after backward."""
    run_fixed_case(fuzz_pool,
                   dict(_CASE, inputs={"x_grad": True, "aux": "none", "aux_grad": False},
                        model={"params": {"w": "trainable", "s": "trainable"},
                               "children": [{"params": {"w": "trainable", "s": "trainable"}, "children": [],
                                             "ops": [["linear"]], "output": "dict", "z3_leaf": False}],
                               "ops": [["child", 0, "reentrant", 1, "none"]], "output": "tensor",
                               "z3_leaf": False}), 7, "I1")


# the shrunk cases of "z3-leaf-kept-by-reuse" (tests/test_v0198.py runs them on v0.19.8)
_Z3_LEAF_ROOT = {"children": [], "output": "tensor", "z3_leaf": True}
_DEFAULT_REUSE = {"gas": 1, "prefetch": "0", "reuse": "default", "persistence": "0"}
Z3_LEAF_KEPT_BY_REUSE = {
    "frozen-weight":
    dict(_CASE, model=dict(_Z3_LEAF_ROOT, params={"w": "frozen", "s": "trainable"}, ops=[["linear"]]),
         zero=_DEFAULT_REUSE),
    "unused-trainable-params":
    dict(_CASE, model=dict(_Z3_LEAF_ROOT, params={"w": "trainable", "s": "trainable"}, ops=[["act", "tanh"]]),
         zero=_DEFAULT_REUSE),
    "child-under-no-grad":
    dict(_CASE,
         inputs={"x_grad": True, "aux": "none", "aux_grad": False},
         model={"params": {"w": "trainable", "s": "trainable"},
                "children": [dict(_Z3_LEAF_ROOT, params={"w": "trainable", "s": "trainable"}, ops=[["linear"]])],
                "ops": [["nograd", 0]], "output": "tensor", "z3_leaf": False},
         zero=_DEFAULT_REUSE),
}


@pytest.mark.needs_patch(11)
@pytest.mark.invariants("I1")
@pytest.mark.parametrize("shape", Z3_LEAF_KEPT_BY_REUSE)
def test_fuzz_z3_leaf_kept_by_reuse(fuzz_pool, shape):
    """Once findings: a z3 leaf with no backward (its output needs no grad: a frozen weight, trainable
    params its forward does not use, a call under no_grad), under DeepSpeed's default reuse distance,
    kept its params gathered after backward from step 1 on. Its release at post-forward scanned the
    later modules of the trace for reuse recursively, its ancestors included, and found every
    param of its own there; 0011 lists each traced module's params as a fetch does. Reuse distance 0
    or a module that is not a z3 leaf passed before. v0.19.2 and every prefix without 0011 leak (pristine
    v0.19.2 another parameter first); v0.19.8 too (PR 9 is the same fix)."""
    case = Z3_LEAF_KEPT_BY_REUSE[shape]
    if applied_patches() < 11:
        with pytest.raises(violation("I1")):
            run_case(fuzz_pool, case)
        return
    run_case(fuzz_pool, case)


@pytest.mark.needs_patch(7)
@pytest.mark.invariants("I1", "I2")
def test_fuzz_no_grad_input_function_run_twice(fuzz_pool):
    """Once a finding (the 30-minute search of the twelve-patch series, run 73, shrunk): a trainable
    child called through its forward function under checkpointing, then plainly, by a caller fed an
    input that needs no grad. The first call reads the child's weight as an external parameter of
    the caller, which the child's own post-forward partitions during the second call. 0007 armed the
    caller's post-backward on the accumulators of the parameters gathered at its post-forward (its
    own), which fired before the recompute read the child's weight: partitioned (RuntimeError: size
    mismatch, got input (2), mat (2x4), vec (0)). Such a caller now waits for the end of the graph
    task. Pristine v0.19.2 breaks I7 first, the prefixes before 0007 leave the head gathered (I1);
    the v0.19.8 follow-up passes."""
    case = dict(_CASE,
                model={"params": {"w": "trainable", "s": "trainable"},
                       "children": [{"params": {"w": "trainable", "s": "trainable"}, "children": [],
                                     "ops": [["linear"]], "output": "tensor", "z3_leaf": False}],
                       "ops": [["child", 0, "function", 1, "none"], ["linear"], ["child", 0, "none", 1, "none"]],
                       "output": "tensor", "z3_leaf": False})
    run_fixed_case(fuzz_pool, case, 7, "I1", "I7")


def run_volume_case(pool, case, pristine_breaks):
    """A volume case that was a finding of I10: on the series it must keep I10 as the RFC states it
    (equal to the volume without checkpointing, or at most that where a case runs a module twice
    or prefetches). Pristine v0.19.2 breaks the invariant ``pristine_breaks`` first."""
    if 0 < applied_patches() < SERIES_LENGTH:
        pytest.skip("checked on pristine v0.19.2 and on the whole series")
    if applied_patches() == 0:
        with pytest.raises(violation(pristine_breaks)):
            run_case(pool, case)
        return
    run_case(pool, case)


@pytest.mark.invariants("I10")
def test_fuzz_volume_with_prefetching(fuzz_pool):
    """Once a finding: with prefetching on (DeepSpeed's default stage3_prefetch_bucket_size) and reuse
    distance 0, a module called twice under module-level checkpointing all-gathers 128 bytes of frozen
    parameters per step from step 1 on (the trace recorded), the same case without checkpointing 192.
    Fewer, not more: I10 now promises at most the volume without checkpointing here, equality only
    with prefetching off and every module run once."""
    child = {"params": {"w": "frozen", "s": "trainable"}, "children": [], "ops": [["linear"]], "output": "tensor",
             "z3_leaf": False}
    run_volume_case(fuzz_pool,
                    dict(_CASE, inputs={"x_grad": True, "aux": "none", "aux_grad": False},
                         zero={"gas": 1, "prefetch": "default", "reuse": "0", "persistence": "0"},
                         model={"params": {"w": "frozen", "s": "trainable"}, "children": [child],
                                "ops": [["child", 0, "module", 1, "none"], ["child", 0, "module", 1, "none"]],
                                "output": "tensor", "z3_leaf": False}),
                    pristine_breaks="I1")


@pytest.mark.invariants("I10")
def test_fuzz_volume_module_run_twice(fuzz_pool):
    """Once a finding: prefetch 0, reuse distance 0, early stop off, a module called twice
    (module-level, then function-level checkpointing) all-gathers 256 bytes of frozen parameters in
    step 1, the same case without checkpointing 384. Fewer, not more (see
    test_fuzz_volume_with_prefetching)."""
    child = {"params": {"w": "frozen", "s": "trainable"}, "children": [], "ops": [["linear"]], "output": "tensor",
             "z3_leaf": False}
    run_volume_case(fuzz_pool,
                    dict(_CASE, inputs={"x_grad": True, "aux": "none", "aux_grad": False},
                         model={"params": {"w": "frozen", "s": "trainable"}, "children": [child],
                                "ops": [["child", 0, "module", 1, "none"], ["child", 0, "function", 1, "none"]],
                                "output": "tensor", "z3_leaf": False}),
                    pristine_breaks="I7")


# the shrunk case of "volume-module-run-twice" (tests/test_v0198.py runs it on v0.19.8)
VOLUME_MODULE_RUN_TWICE = dict(
    _CASE,
    forwards=2,
    early_stop=True,
    inputs={"x_grad": True, "aux": "none", "aux_grad": False},
    model={"params": {"w": "trainable", "s": "trainable"},
           "children": [{"params": {"w": "trainable", "s": "frozen"}, "children": [], "ops": [["linear"]],
                         "output": "tensor", "z3_leaf": False}],
           "ops": [["child", 0, "none", 1, "none"], ["child", 0, "module", 1, "none"]], "output": "tensor",
           "z3_leaf": False})


@pytest.mark.invariants("I10")
def test_fuzz_volume_module_run_twice_plain_then_checkpointed(fuzz_pool):
    """Found on the v0.19.8 follow-up (tox -e fuzz-v0198): two forwards before one backward, each
    calling a child plainly and then under module-level checkpointing, all-gathered 112 bytes of
    frozen parameters per step there, 96 without checkpointing, because v0.19.8 runs one
    post-backward per module, not per invocation (PR 15 fixes that, as 0003 does here). The v0.19.2
    series keeps I10 (at most): a guard for it."""
    run_volume_case(fuzz_pool, VOLUME_MODULE_RUN_TWICE, pristine_breaks="I1")


# the shrunk case of "prefetch-skipped-recompute-param" (tests/test_v0198.py runs it on v0.19.8): a
# child with a frozen vector and two outputs, called twice under module-level checkpointing, with
# prefetching on
PREFETCH_SKIPPED_RECOMPUTE_PARAM = dict(
    _CASE,
    inputs={"x_grad": True, "aux": "none", "aux_grad": False},
    zero={"gas": 1, "prefetch": "default", "reuse": "0", "persistence": "0"},
    model=_node([["child", 0, "module", 1, "none"], ["child", 0, "module", 1, "none"]],
                [_node([["linear"]], s="frozen", output="tuple")]))


@pytest.mark.invariants("I10")
def test_fuzz_volume_prefetch_skipped_recompute_param(fuzz_pool):
    """Found on the v0.19.8 follow-up (the 30-minute fuzz-v0198 search of follow-up-15, twice, in
    volume runs): with prefetching on, a child with a frozen vector and two outputs, called twice
    under module-level checkpointing, all-gathered 32 frozen bytes per step there, 16 without
    checkpointing. The second call's post-backward released the vector its recompute gathered,
    which the prefetcher had skipped for the first call's backward (PR 16 keeps it, as v0.19.8
    keeps the module's own such params). The v0.19.2 series gathers 16 and 16: a guard for it.
    Pristine v0.19.2 raises first (RuntimeError, size 0: the trainable weight, which 0009 keeps)."""
    run_volume_case(fuzz_pool, PREFETCH_SKIPPED_RECOMPUTE_PARAM, pristine_breaks="error")


@pytest.mark.invariants("I10")
def test_fuzz_volume_forward_skipping_a_frozen_param(fuzz_pool):
    """Once a finding (the 30-minute search of series-15), of the oracle, not of ZeRO-3: a child
    whose forward does not use its frozen vector, called under function-level checkpointing
    (checkpoint(kid.forward)), all-gathers no frozen bytes per step, the same case without
    checkpointing 32, when that case called the child as a module. Called as a function, the child's
    own hooks do not run and ZeRO-3 gathers only what its forward reads; called as a module it
    gathers all of the child's params, in forward and again in backward. The run without
    checkpointing now calls the forward as a function, kid.forward(h), which gathers nothing
    either: the volumes must be equal."""
    frozen_vector = {"params": {"w": "trainable", "s": "frozen"}, "children": [_TRAINABLE_LEAF],
                     "ops": [["child", 0, "none", 1, "none"]], "output": "tensor", "z3_leaf": False}
    run_volume_case(fuzz_pool,
                    dict(_CASE, inputs={"x_grad": True, "aux": "none", "aux_grad": False},
                         model={"params": {"w": "trainable", "s": "trainable"},
                                "children": [_TRAINABLE_LEAF, frozen_vector],
                                "ops": [["child", 1, "function", 1, "none"]], "output": "tensor",
                                "z3_leaf": False}),
                    pristine_breaks="error")


# the shrunk case of "checkpointed-param-output-run-twice" (tests/test_v0198.py runs it on v0.19.8)
CHECKPOINTED_PARAM_OUTPUT_RUN_TWICE = dict(
    _CASE,
    inputs={"x_grad": True, "aux": "none", "aux_grad": False},
    model={"params": {"w": "none", "s": "trainable"},
           "children": [{"params": {"w": "none", "s": "trainable"}, "children": [], "ops": [["linear"]],
                         "output": "param", "z3_leaf": False}],
           "ops": [["child", 0, "function", 1, "none"], ["child", 0, "none", 1, "none"]],
           "output": "tensor", "z3_leaf": False})


@pytest.mark.needs_patch(12)
@pytest.mark.invariants("I3")
def test_fuzz_checkpointed_param_output_run_twice(fuzz_pool):
    """Once a finding (tox -e fuzz, 30 minutes, seed of seeds 4035531494, run 4, shrunk; the frozen
    matrices of the shrunk case are not needed, removed): a child returning its own trainable vector,
    called under function-level checkpointing and then plainly. The first call, which runs none of
    the child's hooks, registers the vector as an external parameter of the caller; the child's
    post-forward in the second call then partitioned the vector it returned (RuntimeError: size of
    tensor a (4) must match b (0), in the forward). 0012 keeps a returned parameter gathered also
    when a module on the stack already holds it. v0.19.2 and every prefix before 0012 fail the same
    way; v0.19.8 too, where PR 10 is the same change."""
    run_fixed_case(fuzz_pool, CHECKPOINTED_PARAM_OUTPUT_RUN_TWICE, 12, "error")


@pytest.mark.needs_patch(8)
@pytest.mark.invariants("I1")
def test_fuzz_no_grad_child_returns_its_input(fuzz_pool):
    """Once a finding (fuzz run 104, seed 678684190630930457, shrunk): a child called under
    torch.no_grad returns its input unchanged. Torch hands the caller that same grad-requiring
    tensor; ZeRO-3's forward hooks passed the child's inputs and outputs through autograd Functions
    that return detached tensors and, under no_grad, attach no node, so the caller's gradient
    through the child was lost (root.w off by 1.336). 0008 leaves a no_grad invocation's tensors to
    torch. Pristine v0.19.2 leaks first (I1: the root's input no longer requires grad), the
    prefixes without 0008 break the gradient."""
    case = dict(_CASE, inputs={"x_grad": True, "aux": "none", "aux_grad": False},
                model={"params": {"w": "trainable", "s": "trainable"},
                       "children": [{"params": {"w": "none", "s": "trainable"}, "children": [],
                                     "ops": [["linear"]], "output": "tensor", "z3_leaf": False}],
                       "ops": [["linear"], ["nograd", 0]], "output": "tensor", "z3_leaf": False})
    if applied_patches() < 8:
        with pytest.raises((violation("I1"), violation("grad"))):
            run_case(fuzz_pool, case)
        return
    run_case(fuzz_pool, case)


@pytest.mark.skipif(applied_patches() < SERIES_LENGTH,
                    reason="pristine v0.19.2 (and a prefix of the series) fails this case with I7 first")
def test_fuzz_gradient_below_the_smallest_normal(fuzz_pool):
    """A guard, once reported as a finding (max abs diff 1.401e-45 in the head's gradient): a
    micro-batch gradient of 2**-149 that ZeRO-3's data-parallel average pre-divides by the world
    size, which rounds it to 0 (and -63 * 2**-149 to -64 * 2**-149). Not a lifecycle bug: emulating
    that average on the reference's per-micro-batch gradients gives ZeRO-3's gradients bit for bit on
    v0.19.2 and v0.19.8, pristine or patched, and on 1 rank the case passes. The fuzzer compares
    exactly down to the smallest normal float (tests/scenarios/gradcompare.py); this case fails an
    exact comparison on 2 ranks."""
    grandchild = {"params": {"w": "none", "s": "trainable"}, "children": [],
                  "ops": [["linear"], ["linear"], ["external", 5], ["external", 0]], "output": "tuple",
                  "z3_leaf": False}
    ops = [["linear"], ["scale"], ["linear"], ["child", 0, "function", 2, "keyword"]]
    child = {"params": {"w": "frozen", "s": "trainable"}, "children": [grandchild], "ops": ops, "output": "tensor",
             "z3_leaf": False}
    run_case(fuzz_pool,
             dict(_CASE, inputs={"x_grad": False, "aux": "none", "aux_grad": True}, forwards=3, early_stop=True,
                  zero={"gas": 3, "prefetch": "0", "reuse": "default", "persistence": "0"},
                  model={"params": {"w": "trainable", "s": "trainable"}, "children": [child], "ops": ops,
                         "output": "tuple", "z3_leaf": False}))


def test_a_finding_reaches_the_fuzz_log_with_its_shrunk_case():
    """`python -m tests.lifecycle_fuzz` catches what a search raises and prints the shrunk case and the
    paste-ready test from the exception's notes (lifecycle_fuzz._notes): the hypothesis in use must hand
    them over there, not print them itself. A 30-minute run once logged "shrunk case above" with
    nothing above."""
    hypothesis = pytest.importorskip("hypothesis")

    @hypothesis.given(hypothesis.strategies.integers())
    @hypothesis.settings(database=None, derandomize=True, max_examples=200)
    def fails_from_ten(n):
        hypothesis.note(f"paste-ready regression test: n={n}")
        assert n < 10

    with pytest.raises(AssertionError) as raised:
        fails_from_ten()
    text = "\n".join(lifecycle_fuzz._notes(raised.value))
    assert "fails_from_ten(\n    n=10," in text and "paste-ready regression test: n=10" in text


class _NoRanks:
    """Stands in for the rank pool of `python -m tests.lifecycle_fuzz` where the search is faked."""

    def __init__(self, *args, **kwargs):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_an_interrupted_search_still_prints_its_counts(monkeypatch, capsys):
    """Ctrl-C during `python -m tests.lifecycle_fuzz` ends the search with the same summary a finished
    one prints (cases run, findings by invariant) and exit status 130, not with a traceback that
    loses what the minutes before found."""

    def interrupted_search(pool, *, stats, **kwargs):
        stats.cases += 3
        stats.failures["I1"] += 1
        stats.examples["I1"] = ("root: still gathered after backward", {"steps": 1})
        raise KeyboardInterrupt

    monkeypatch.setattr(lifecycle_fuzz, "RankPool", _NoRanks)
    monkeypatch.setattr(lifecycle_fuzz, "search", interrupted_search)
    try:
        status = lifecycle_fuzz.main(["--seconds", "60", "--database", "", "--seed", "1"])
    except KeyboardInterrupt:
        pytest.fail("the interrupt escaped main() without the search's summary")
    out = capsys.readouterr().out
    assert status == 130
    assert "interrupted" in out and "3 cases ran" in out
    assert "first case that broke I1 (unshrunk): root: still gathered after backward" in out


@pytest.mark.parametrize("every, expected", [(None, [False, False, True] * 2), ("2", [False, True] * 3),
                                             ("0", [False] * 6)])
def test_long_search_draws_volume_cases_in_every_nth_run(monkeypatch, capsys, every, expected):
    """The general draw meets I10's conditions in few cases (3 of the first 180 of a 30-minute
    search of series-20), so `python -m tests.lifecycle_fuzz` draws only such cases in every
    --volume-every-th run (default 3; 0: never)."""
    drawn = []

    def six_runs(pool, *, stats, volume, **kwargs):
        drawn.append(volume)
        if len(drawn) == 6:
            raise KeyboardInterrupt

    monkeypatch.setattr(lifecycle_fuzz, "RankPool", _NoRanks)
    monkeypatch.setattr(lifecycle_fuzz, "search", six_runs)
    argv = ["--seconds", "60", "--database", "", "--seed", "1"] + (["--volume-every", every] if every else [])
    assert lifecycle_fuzz.main(argv) == 130
    assert drawn == expected
    assert capsys.readouterr().out.count(", volume cases") == expected.count(True)


@pytest.mark.needs_patch(0)
def test_fuzz_rejects_a_case_whose_reference_overflows(fuzz_pool):
    """Once a finding of the oracle, not of ZeRO-3 (the 30-minute search of series-19, run 53): a
    child scaling by its vector, called three times by a parent that scales too and is called three
    times by its own parent, in three forwards per step, drives the plain torch reference's loss to
    2.5e20 and its gradients to NaN; NaN compares unequal to itself, and the case was reported as a
    wrong gradient. The fuzzer must reject such a case as it rejects one the reference cannot run.
    The same on every tree."""
    leaf = {"params": {"w": "trainable", "s": "trainable"}, "children": [], "ops": [["scale"]], "output": "tensor",
            "z3_leaf": False}
    inner = {"params": {"w": "trainable", "s": "trainable"}, "children": [leaf],
             "ops": [["child", 0, "none", 3, "none"], ["scale"], ["child", 0, "none", 3, "none"]],
             "output": "tuple", "z3_leaf": False}
    outer = {"params": {"w": "trainable", "s": "trainable"}, "children": [inner],
             "ops": [["child", 0, "none", 3, "none"], ["nograd", 0]], "output": "tensor", "z3_leaf": False}
    case = dict(_CASE, forwards=3, inputs={"x_grad": True, "aux": "positional", "aux_grad": False},
                zero={"gas": 2, "prefetch": "0", "reuse": "0", "persistence": "0"},
                model={"params": {"w": "trainable", "s": "none"}, "children": [outer],
                       "ops": [["child", 0, "none", 3, "none"]], "output": "tensor", "z3_leaf": False})
    with pytest.raises(ValueError, match="not finite"):
        lifecycle_fuzz.check(fuzz_pool, case)


@pytest.mark.needs_patch(0)
def test_fuzz_rejects_a_parameter_returned_through_a_reentrant_checkpoint(fuzz_pool):
    """Once a hang of the fuzzer itself (a 30-minute search of series-9, run 55, seed
    2435701340260411931): a child checkpointed with use_reentrant=True returns its own parameter.
    Torch's CheckpointFunction makes that parameter an output of its own, giving the parameter a
    grad_fn, so the plain torch reference's backward reruns the checkpoint from inside itself
    without end (a new autograd thread per level) and the rank never answered. Not a DeepSpeed
    finding: the case is not a valid torch model, and the fuzzer must reject it as one. The same on
    every tree."""
    case = dict(_CASE, inputs={"x_grad": True, "aux": "none", "aux_grad": False},
                zero={"gas": 2, "prefetch": "0", "reuse": "default", "persistence": "0"},
                model={"params": {"w": "frozen", "s": "trainable"},
                       "children": [{"params": {"w": "none", "s": "trainable"}, "children": [],
                                     "ops": [["act", "relu"]], "output": "param", "z3_leaf": False}],
                       "ops": [["child", 0, "reentrant", 1, "positional"]], "output": "tensor", "z3_leaf": False})
    with pytest.raises(ValueError, match="reentrant"):
        lifecycle_fuzz.check(fuzz_pool, case)
