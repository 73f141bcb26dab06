"""Per-base expectations: which DeepSpeed release the suite runs against, and what each scenario
test must do there.

ZERO3_VERSION names the release the installed DeepSpeed was built from (default v0.19.2; the tox
environments *-v0198 set v0.19.8). ZERO3_SERIES_PREFIX keeps its meaning: how many patches of that
release's series (patches/ZERO3_VERSION/series) the installed tree carries.

On v0.19.2 nothing changes: each test's own ``needs_patch(k)`` marker decides, as before.

On v0.19.8 (which carries upstream's own fix, #8148, so most v0.19.2 regression tests pass on the
pristine release) the expectations come from V0198 below, applied as a ``v0198(k)`` marker, and
put in front of the test's own ``needs_patch`` for the scenario runner of tests/test_frozen_ckpt.py:

- 0: a guard, passes on pristine v0.19.8 and with every patch of its follow-up series;
- k >= 1: a regression test, fails on pristine v0.19.8 and passes once patch k of the follow-up
  (patches/v0.19.8/) is applied;
- GAP: fails on v0.19.8 with the whole follow-up too: a problem shown on v0.19.8 that the follow-up
  does not fix yet. The test then asserts that its scenario still fails, so a fix shows up as a
  failure to re-mark;
- NOT_APPLICABLE: skipped (the test exercises code that only the v0.19.2 series has).

The table lives here, not as markers in the test files, so that the v0.19.2 markers can change
without touching it; a scenario test missing from it is a usage error on v0.19.8.
"""

import importlib.util
import os
import sys

import pytest

BASES = ("v0.19.2", "v0.19.8")
SERIES_V0198 = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "patches", "v0.19.8",
                            "series")
GAP = sys.maxsize  # "needs a patch that does not exist": the runner then expects the scenario to fail
NOT_APPLICABLE = "not applicable"

# test function name, or name[param ids] for one parametrization -> expectation on v0.19.8.
# Numbers are the patches of patches/v0.19.8/series: 1 fast sharding keeps the data of params it
# does not release, 2 a recompute's frozen params belong to the module recomputed, 3 no pre-backward
# gather for a module whose output is a leaf, 4 the available-param count subtracts only what it
# counted, 5 stale FWD_MODULE_STACK entries dropped at the root forward, 6 a z3 leaf's grads reduced
# after its backward when no input needs grad, 7 a no_grad module's inputs and outputs left to torch,
# 8 a module's trainable params kept across a recompute inside its own backward, 9 a z3 leaf's reuse
# scan counts a traced module's own params, 10 a returned parameter its caller already holds kept
# gathered, 11 a z3 leaf's grads reduced when its output is not a tuple (needs 6), 12 a param's
# second gradient reduction in one micro-step added to the first, 13 a z3 leaf's grads that its
# backward hook did not reduce reduced in the epilogue, 14 a zero gradient reduced when a grad hook
# runs without one, 15 input grads counted per module invocation. The patches form four batches,
# each safe alone (patches/v0.19.8/batches, scripts/prove_batches.py); ZERO3_SERIES_PREFIX=n
# still means "the first n".
V0198 = {
    "test_frozen_norm": 0,
    # v0.19.8: RuntimeError in the forward (the returned scale partitioned, size 0)
    "test_returned_param_after_forward_function": 10,
    # v0.19.8: the z3 leaves' grads never reduced (torch skips their full backward hook)
    "test_z3_leaf_mapping_output": 11,
    "test_frozen_norm_relu_tail": 0,
    "test_frozen_norm_deepspeed_defaults": 4,  # v0.19.8: available-parameter count negative (-194)
    "test_frozen_norm_reentrant_unchanged": 0,
    "test_deepspeed_checkpoint": 0,
    # v0.19.8: RuntimeError: The size of tensor a (0) must match the size of tensor b (8) (no early stop)
    "test_deepspeed_non_reentrant_checkpoint": 8,
    "test_lora_blocks": 0,
    "test_frozen_linear_weight_zero_init": 0,
    "test_frozen_linear_weight_plain": 0,
    "test_quantized_base_keeps_weight_on_ctx": 0,
    "test_no_grad_block_input_with_accumulation": 0,  # release_backward_leftovers() (#8148)
    # v0.19.8: the blocks' gradients 0 (the no_grad module hands the head a detached copy)
    "test_no_grad_module_passes_its_input_through": 7,
    # open on both bases: wrong gradients on v0.19.8, a crash in backward with PR 7
    "test_no_grad_module_reenabling_grad_inside": GAP,
    # v0.19.8 fails as v0.19.2 does: the recompute partitions the Linear's weight before AccumulateGrad
    "test_recompute_without_early_stop": 8,
    # pristine v0.19.8 and the follow-up release the bias there (PR 8's first version, keyed on
    # __active_backward_submodules, kept it on top of PR 2)
    "test_trainable_bias_released_by_early_stopped_recompute": 0,
    "test_persistent_norms_stay_gathered": 4,  # v0.19.8: available-parameter count negative (-32)
    "test_z3_leaf_module_with_several_outputs": 0,
    # v0.19.8: the block's params left gathered after the backward of step 1
    "test_z3_leaf_without_backward_released": 9,
    "test_fast_sharding_leaf_modules": 1,  # v0.19.8: CheckpointError, recomputed shape [1] (2 alone fixes it too)
    "test_reentered_module": 0,
    "test_forward_stack_bounded_across_early_stops": 5,
    # v0.19.8: the stack keeps the failing block; with 5 alone the retry's available-parameter count
    # goes negative (-72): it needs 4 and 5, that is the first 5 patches
    "test_exception_in_recompute_then_retry": 5,
    "test_exception_in_backward_then_next_step": 0,
    "test_several_forwards_then_one_backward": 0,
    "test_external_parameters": 0,
    "test_reentrant_frozen_module_fed_detached_tensor": 0,
    "test_frozen_peak_is_one_block[module]": 0,
    "test_frozen_peak_is_one_block[function]": 2,  # v0.19.8: 8 of 8 frozen params
    "test_frozen_peak_is_one_block_reentrant": 2,  # v0.19.8: 8 of 8 frozen params
    "test_prompt_release_after_last_backward_use": 2,  # v0.19.8: frozen norms still gathered after last use
    "test_prompt_release_without_backward_consumer": 0,
    "test_frozen_all_gather_volume_matches_no_checkpointing": 0,  # this model's recompute starts at the block
    "test_embedding_without_backward_not_gathered_in_backward": 3,  # v0.19.8: all-gathered in backward
    # v0.19.8 (#8148) no longer crashes there, so it has nothing to warn about: the warning and the
    # CheckpointError kept without graph-task detection are the v0.19.2 series' own
    "test_undetectable_recompute_warns_and_keeps_checkpoint_error": NOT_APPLICABLE,
    "test_counter_non_negative_under_default_settings": 4,  # v0.19.8: available-parameter count -194
    "test_several_forwards_then_one_backward_trainable": 0,
    "test_shared_frozen_norm_mixed_invocations": 0,
    "test_early_stop_in_frozen_only_module_fed_by_input": 0,
    "test_early_stop_in_frozen_only_module": 0,
    # under DeepSpeed's defaults, v0.19.8's available-parameter count goes negative (-2562)
    "test_early_stop_in_frozen_only_module[attribute-inside-defaults]": 4,
    "test_early_stop_in_frozen_only_module[mixed-inside-defaults]": 4,
    "test_early_stop_in_frozen_only_module[leaf-after-defaults]": 4,
    "test_keyword_input": 0,
    "test_input_through_attribute_with_frozen_weight": 0,
    # the late-release warning is the v0.19.2 series' ledger; v0.19.8 trains this model cleanly
    # (no CheckpointError, quiescent after every step) and warns nothing
    "test_unused_output_late_release_reported_once": NOT_APPLICABLE,
    "test_dropped_side_output_released_by_recompute": 0,
    # v0.19.8's epilogue sweep (release_backward_leftovers) releases what the second pre-backward gathers
    "test_returned_param_with_unused_sibling": 0,
    # v0.19.8: the shared weight reduced twice in one backward (AssertionError in the reduce bucket;
    # PR 12), and with PR 12 alone the available-parameter count negative (-72; PR 4)
    "test_shared_layer_checkpointed_both_ways": 12,
    "test_direct_loss_backward": 0,
    "test_cpu_param_offload[lifecycle]": 0,
    "test_cpu_param_offload[defaults]": 4,  # v0.19.8: available-parameter count -194
    "test_engine_compile": 0,
    "test_engine_compile_of_outputs_that_need_no_grad": 0,
    "test_full_finetune_release_order_unchanged": 0,  # v0.19.2's golden traces hold on v0.19.8, defaults too
    "test_eval_forward_unchanged": 0,
    # v0.19.8 applies its backward functions in a non-reentrant recompute too: each checkpointed
    # module keeps one pre-backward count per step
    "test_recompute_makes_no_backward_functions": GAP,
    "test_gradient_penalty_in_checkpointed_region": 0,
    # the forward's graph run twice (autograd.grad with the graph retained, then backward): v0.19.8
    # fails "active_backward_submodules is empty during backward pass", or a size-0 parameter in the
    # second run; with the follow-up too, or every parameter stays gathered after backward (15's
    # per-invocation counter runs out in the first run)
    "test_input_gradient_penalty": GAP,
    "test_input_gradient_of_repeated_blocks": GAP,
    "test_input_gradient_of_one_branch": GAP,
    "test_hf_llama_peft_lora": 4,  # v0.19.8: available-parameter count negative (-1024)
    "test_hf_llama_peft_lora_half_precision": 4,  # the same
    "test_hf_trainer_with_zero3_config": 0,
    "test_hf_t5_lora_encoder_decoder": 4,
    "test_hf_mixtral_lora_z3_leaves": 4,  # v0.19.8: available-parameter count negative (-1024)
    "test_hf_llama_peft_lora_classifier": 4,  # v0.19.8: available-parameter count negative (-1024)
    # tests/test_v0198.py
    "test_llama_lora_frozen_all_gather_volume": 2,  # v0.19.8: 1.32x the no-checkpointing volume
    # v0.19.8: RuntimeError in the first backward (the leaf's grads reduced before they exist)
    "test_leaf_module_no_grad_input": 6,
    # #8148's tracker attributes a two-output leaf's recompute correctly on CPU (candidate dropped)
    "test_leaf_recompute_attribution": 0,
}


def series_length(v0192_length):
    """The number of patches ZERO3_SERIES_PREFIX counts up to on the installed base: on v0.19.2 the
    caller's (tests/test_frozen_ckpt.py knows which patches of that series fix something), on
    v0.19.8 every patch of patches/v0.19.8/series."""
    if installed_base() != "v0.19.8":
        return v0192_length  # v0.19.2 and its backports
    with open(SERIES_V0198) as series:
        return sum(1 for line in series if line.strip() and not line.lstrip().startswith("#"))


def _backport_bases():
    """The releases whose series is a port of the v0.19.2 series (scripts/backport_env.py): they
    share its patch numbers, so v0.19.2's needs_patch markers hold there as they are."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "backport_env.py")
    spec = importlib.util.spec_from_file_location("zero3_backport_env", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.backport_bases()


def installed_base():
    # empty counts as unset: .ci/run passes ZERO3_VERSION= to the environments of the default base
    base = os.environ.get("ZERO3_VERSION") or BASES[0]
    if base not in BASES and base not in _backport_bases():
        raise pytest.UsageError(f"ZERO3_VERSION={base!r}: expected one of {', '.join(BASES)} or a backport base "
                                f"({', '.join(_backport_bases())})")
    return base


def v0198_expectation(item):
    for key in (item.name, item.originalname):
        if key in V0198:
            return V0198[key]
    return None


def pytest_report_header(config):
    return f"zero3 base: {installed_base()} (ZERO3_VERSION)"


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    if installed_base() == "v0.19.8":
        _expect_v0198(items)
    _keep_prefix_proof(config, items)


def _keep_prefix_proof(config, items):
    """With ZERO3_PREFIX_PROOF=1 (scripts/prove-series.sh), only what prefix ZERO3_SERIES_PREFIX=n
    proves runs: the tests of patch n (they pass with it), those of patch n+1 (they still fail: that
    patch is needed) and the guards. The whole series (tox -e cpu) and pristine (tox -e pristine) run
    every test."""
    if os.environ.get("ZERO3_PREFIX_PROOF") != "1":
        return
    prefix = int(os.environ.get("ZERO3_SERIES_PREFIX", "-1"))
    proven = {0, prefix, prefix + 1}
    kept, dropped = [], []
    for item in items:
        mark = item.get_closest_marker("needs_patch")
        (kept if mark is None or mark.args[0] in proven else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def _expect_v0198(items):
    missing = []
    for item in items:
        expectation = v0198_expectation(item)
        if expectation is None and item.get_closest_marker("needs_patch") is None:
            continue  # not a scenario with a per-patch expectation
        if expectation is None:
            missing.append(item.nodeid)
        elif expectation == NOT_APPLICABLE:
            item.add_marker(pytest.mark.skip(reason="exercises the v0.19.2 series' own code, absent from v0.19.8"))
        else:
            item.add_marker(pytest.mark.v0198(expectation))
            # the scenario runner reads the closest needs_patch marker: this one, put first
            item.add_marker(pytest.mark.needs_patch(expectation), append=False)
    if missing:
        raise pytest.UsageError("no v0.19.8 expectation in tests/bases.py for: " + ", ".join(missing))
