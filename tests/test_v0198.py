"""Scenarios of the v0.19.8 follow-up series, run only against DeepSpeed v0.19.8 (ZERO3_VERSION).

Their expectations (which follow-up patch each needs) are in tests/bases.py, like those of the
shared scenarios; they run in the Hugging Face scenarios' rank pool (hf_pool, tests/conftest.py).
"""

import pytest

from tests.bases import installed_base
from tests.test_frozen_ckpt import scenario_runner
from tests.test_lifecycle_fuzz import (CHECKPOINTED_PARAM_OUTPUT_RUN_TWICE, FROZEN_PARAM_RETURNED_THROUGH_FUNCTION,
                                      OUTPUT_UNUSED_UNDER_RECOMPUTE, PREFETCH_SKIPPED_RECOMPUTE_PARAM, REDUCED_TWICE,
                                      REDUCED_TWICE_RUNS, REENTRANT_LEAF_OUTPUT, VOLUME_MODULE_RUN_TWICE,
                                      Z3_LEAF_DICT_OUTPUT, Z3_LEAF_DICT_OUTPUT_PARAMS_UNUSED, Z3_LEAF_HOOK_NOT_CALLED,
                                      Z3_LEAF_KEPT_BY_REUSE, run_case, run_experts_routed_by_rank, run_fixed_case,
                                      with_bucket)

pytestmark = pytest.mark.skipif(installed_base() != "v0.19.8", reason="a v0.19.8 follow-up scenario (ZERO3_VERSION)")

FOLLOWUP = "tests.scenarios.followup"


@pytest.fixture
def scenario(hf_pool, request):
    return scenario_runner(hf_pool, request)


# Not tagged I10: I10 says equal volumes, and this asserts at most 1.02x (VOLUME_TOLERANCE in
# tests/scenarios/followup.py), so a break of I10 below 2 % would pass it.
def test_llama_lora_frozen_all_gather_volume(scenario):
    """The follow-up's frozen all-gather volume with checkpointing is within 1.02x of the volume
    without it (a tiny Llama + LoRA)."""
    scenario(f"{FOLLOWUP}:llama_lora_all_gather_volume")


@pytest.fixture
def small_scenario(rank_pool, request):
    """The small-model scenarios run in the shared rank pool, like those of tests/test_frozen_ckpt.py."""
    return scenario_runner(rank_pool, request)


@pytest.mark.invariants("I1", "I2", "I10")
@pytest.mark.parametrize("topology", ["split", "inside", "interleave"])
def test_leaf_recompute_attribution(small_scenario, topology):
    """A z3 leaf with two outputs under checkpointing: the frozen params a recompute gathers are
    attributed to a module whose post-backward comes after their last use (no second all-gather,
    nothing left gathered). Prints the attribution seen."""
    attribution = small_scenario(f"{FOLLOWUP}:leaf_recompute_attribution", topology=topology)
    if attribution is not None:
        print(f"{topology}: {attribution[0]}")


@pytest.mark.invariants("I1")
@pytest.mark.parametrize("shape", Z3_LEAF_KEPT_BY_REUSE)
def test_fuzz_z3_leaf_kept_by_reuse(fuzz_pool, shape):
    """Once lifecycle fuzz findings (the frozen weight on the follow-up: the fuzz-v0198 search,
    python -m tests.lifecycle_fuzz --skip-known tests.test_lifecycle_fuzz:known_finding_v0198, seed
    of seeds 11965896, run 4, shrunk; the other shapes on the v0.19.2 series): a z3 leaf with no
    backward, under DeepSpeed's default stage3_max_reuse_distance, kept its params AVAILABLE after
    the backward of step 1 (step 0 records the trace). Pristine v0.19.8 and the follow-up without
    PR 9 leak; PR 9 (0011 of the v0.19.2 series) fixes it."""
    run_fixed_case(fuzz_pool, Z3_LEAF_KEPT_BY_REUSE[shape], 9, "I1")


@pytest.mark.invariants("I3")
def test_fuzz_checkpointed_param_output_run_twice(fuzz_pool):
    """Once a lifecycle fuzz finding (tox -e fuzz on the v0.19.2 series, shrunk; v0.19.8 fails the
    same way): a child returning its own trainable vector, called under function-level checkpointing
    and then plainly; its post-forward partitioned the vector it returned (RuntimeError in the
    forward, size 0). Pristine v0.19.8 and the follow-up without PR 10 fail; PR 10 (0012 of the
    v0.19.2 series) fixes it."""
    run_fixed_case(fuzz_pool, CHECKPOINTED_PARAM_OUTPUT_RUN_TWICE, 10, "error")


@pytest.mark.invariants("I1")
def test_fuzz_z3_leaf_dict_output_gradients(fuzz_pool):
    """Once a lifecycle fuzz finding (on the v0.19.2 series, shrunk; v0.19.8 fails the same way): a
    z3 leaf returning a dict got a wrong gradient for its weight, because torch never calls the full
    backward hook that reduces a z3 leaf's grads unless the output is a Tensor or a tuple. Pristine
    v0.19.8 and the follow-up without PR 11 fail; PR 11 (0013 of the v0.19.2 series) fixes it."""
    run_fixed_case(fuzz_pool, Z3_LEAF_DICT_OUTPUT, 11, "grad")


@pytest.mark.invariants("I1")
def test_fuzz_z3_leaf_dict_output_params_unused(fuzz_pool):
    """A guard (tests/test_lifecycle_fuzz.py has the story): a z3 leaf returning a dict whose forward
    uses none of its trainable params; PR 11's reduction runs before any pre-backward gathered the
    leaf, so PR 6 zero-fills the params at their full size. Pristine v0.19.8 passes too."""
    run_case(fuzz_pool, Z3_LEAF_DICT_OUTPUT_PARAMS_UNUSED)


@pytest.mark.invariants("I1")
@pytest.mark.parametrize("family, bucket", REDUCED_TWICE_RUNS)
def test_fuzz_param_reduced_twice(fuzz_pool, family, bucket):
    """Once lifecycle fuzz findings (on the v0.19.2 series, shrunk; v0.19.8 fails the same way): a
    param whose gradient reaches stage 3's reduction twice in one backward (a z3 leaf run twice, a
    module run twice under reentrant checkpointing, a reentrant checkpoint reading its caller's
    vector): AssertionError in the reduce bucket, or with a bucket of one element a wrong gradient.
    Pristine v0.19.8 and the follow-up without PR 12 fail; PR 12 (0014 of the v0.19.2 series) fixes it."""
    run_fixed_case(fuzz_pool, with_bucket(REDUCED_TWICE[family], bucket), 12, "error", "grad")


@pytest.mark.invariants("I1")
@pytest.mark.parametrize("shape", Z3_LEAF_HOOK_NOT_CALLED)
def test_fuzz_z3_leaf_grads_reduced_without_backward_hook(fuzz_pool, shape):
    """Once lifecycle fuzz findings (tests/test_lifecycle_fuzz.py has the story): a trainable z3 leaf
    whose full backward hook torch does not call (its forward run by checkpoint(leaf.forward), its
    output cut from its input, or the leaf idle while another module reads its vector) got a wrong
    gradient, silently. Pristine v0.19.8 and the follow-up without PR 13 fail; PR 13 (0015 of the
    v0.19.2 series) reduces those grads in the backward epilogue."""
    run_fixed_case(fuzz_pool, Z3_LEAF_HOOK_NOT_CALLED[shape], 13, "grad", "I7", "I1")


@pytest.mark.invariants("I1")
def test_z3_leaf_experts_routed_by_rank(fuzz_pool):
    """tests/test_lifecycle_fuzz.py has the story: a z3 leaf of two experts whose backward hook
    torch never calls, each rank routing to another expert. Pristine v0.19.8 and the follow-up
    without PR 13 never reduce the experts' params."""
    run_experts_routed_by_rank(fuzz_pool, 13)


@pytest.mark.invariants("I1")
def test_fuzz_reentrant_leaf_output(fuzz_pool):
    """Once a lifecycle fuzz finding (tests/test_lifecycle_fuzz.py has the story): a reentrant
    checkpoint returned None for an input computed from a trainable vector, torch still ran the
    vector's grad hook, and the reduction found no grad (AttributeError). Pristine v0.19.8 and the
    follow-up without PR 14 fail; PR 14 (0016 of the v0.19.2 series) reduces zeros there."""
    run_fixed_case(fuzz_pool, REENTRANT_LEAF_OUTPUT, 14, "error")


@pytest.mark.invariants("I4")
def test_fuzz_output_unused_under_recompute(fuzz_pool):
    """tests/test_lifecycle_fuzz.py has the story of this v0.19.2 series finding: a module whose
    output the next module reads detached, holding a frozen vector, recomputed under module-level
    checkpointing. The follow-up holds nothing for it past backward. Pristine v0.19.8 and the
    follow-up without PR 8 fail in backward, as pristine v0.19.2 does (RuntimeError, a tensor of
    size 0: the recompute partitions a trainable weight its own backward is about to use)."""
    run_fixed_case(fuzz_pool, OUTPUT_UNUSED_UNDER_RECOMPUTE, 8, "error")


@pytest.mark.invariants("I10")
def test_fuzz_volume_module_run_twice(fuzz_pool):
    """Once a lifecycle fuzz finding of the follow-up (tests/test_lifecycle_fuzz.py has the story):
    two forwards before one backward, each calling a child plainly and then under module-level
    checkpointing, all-gathered more frozen bytes per step than without checkpointing (112 vs 96),
    because the run without it kept the child gathered through the rest of backward. PR 15 gives
    every invocation its own post-backward (128 and 128). The follow-up without it breaks I10;
    pristine v0.19.8 breaks I8 first."""
    run_fixed_case(fuzz_pool, VOLUME_MODULE_RUN_TWICE, 15, "I10", "I8")


@pytest.mark.invariants("I10")
def test_fuzz_frozen_param_returned_through_function(fuzz_pool):
    """tests/test_lifecycle_fuzz.py has the story of this finding of both series, which was the
    oracle's: a child called as checkpoint(kid.forward) that returns its own frozen vector gathers
    the frozen bytes of kid.forward(h) without checkpointing, 32 a step. Pristine v0.19.8 and the
    follow-up without PR 4 break I7 first (the available-parameter count -20 after the forward)."""
    run_fixed_case(fuzz_pool, FROZEN_PARAM_RETURNED_THROUGH_FUNCTION, 4, "I7")


@pytest.mark.invariants("I10")
def test_fuzz_volume_prefetch_skipped_recompute_param(fuzz_pool):
    """Once a lifecycle fuzz finding of the follow-up (tests/test_lifecycle_fuzz.py has the story):
    with prefetching on, a child with a frozen vector and two outputs, called twice under
    module-level checkpointing, all-gathered 32 frozen bytes per step, 16 without checkpointing: the
    second call's post-backward released what its recompute gathered although the prefetcher had
    skipped it for the first call's backward. The follow-up without PR 16 breaks I10, pristine
    v0.19.8 raises first (RuntimeError, size 0: the trainable weight, which PR 8 keeps); PR 16 keeps
    such a param gathered."""
    run_fixed_case(fuzz_pool, PREFETCH_SKIPPED_RECOMPUTE_PARAM, 16, "I10", "error")
