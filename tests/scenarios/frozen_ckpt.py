"""The scenarios, one function each. They run on every rank of the pool and raise on failure.

Each docstring names what pristine v0.19.2 does; tests/test_frozen_ckpt.py says which ones must
fail there (regressions) and which must pass on both (guards).
"""

import contextlib
import functools
import json

import pytest
import torch

import deepspeed
from deepspeed import comm as dist
from deepspeed.accelerator import get_accelerator
from deepspeed.runtime.zero import parameter_offload
from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

from tests.scenarios import models
from tests.scenarios.zero3 import (DTYPES, assert_forward_stack_clean, count_all_gathers, discard_aborted_backward,
                                   assert_grads_match, assert_quiescent, batch, build, frozen_available, full_grad,
                                   lifecycle_config, outstanding_releases, record_lifecycle_trace, reference_grads,
                                   skip_unless_dtype_supported, sync_reference, train, coordinator_of)

DIM = 8
# hidden size of the default-settings traces: Linear weights above the default persistence threshold
DEFAULTS_DIM = 320


def _inputs(engine, *, dtype="fp32", requires_grad=True, shape=(2, DIM)):
    return lambda step: (batch(step, shape, device=engine.device, dtype=DTYPES[dtype], requires_grad=requires_grad), )


def _build_and_train(factory, config, *, zero_init=False, inputs=_inputs, **train_kwargs):
    """Builds the engine and its reference from ``factory``, trains both side by side."""
    engine, reference = build(factory, config, zero_init=zero_init)
    try:
        return train(engine, reference, inputs(engine), **train_kwargs)
    finally:
        engine.destroy()


def _skip_unless_supported(dtype):
    reason = skip_unless_dtype_supported(dtype)
    if reason:
        pytest.skip(reason)


def frozen_norm(*, checkpointing="module", dtype="fp32", relu=False, depth=2, defaults=False, steps=2):
    """Seed reproducer: frozen LayerNorm -> trainable Linear in checkpointed blocks.
    v0.19.2: CheckpointError (recomputed shape [0]) in the first backward."""
    _skip_unless_supported(dtype)
    config = lifecycle_config(dtype=dtype, defaults=defaults)
    factory = functools.partial(models.frozen_norm_stack, DIM, depth, checkpointing, relu)
    return _build_and_train(factory,
                            config,
                            inputs=lambda engine: _inputs(engine, dtype=dtype),
                            steps=steps,
                            exact=dtype == "fp32")


def lora(*, zero_init=False, checkpointing="module", dtype="fp32"):
    """LoRA-shaped blocks: frozen norm and frozen base Linear, trainable A/B.
    v0.19.2: CheckpointError."""
    _skip_unless_supported(dtype)
    config = lifecycle_config(dtype=dtype)
    factory = functools.partial(models.lora_stack, DIM, 2, checkpointing)
    # DeepSpeed's linear (zero.Init) computes x @ w.t() + b rather than addmm: same maths, other rounding
    return _build_and_train(factory,
                            config,
                            zero_init=zero_init,
                            inputs=lambda engine: _inputs(engine, dtype=dtype),
                            exact=dtype == "fp32" and not zero_init)


def frozen_linear_weight(*, zero_init=True):
    """A block whose only frozen parameters are Linear weights and biases (no norm).
    Built under zero.Init, DeepSpeed's linear saves the weight itself: v0.19.2 crashes. A plain
    nn.Linear saves a transposed view that survives partitioning: v0.19.2 works (guard)."""
    config = lifecycle_config()

    def factory():
        stack = models.lora_stack(DIM, 2, "module")
        for block in stack.blocks:
            block.norm.requires_grad_(True)
        return stack

    return _build_and_train(factory, config, zero_init=zero_init, exact=not zero_init)


def quantized_base(*, checkpointing="module"):
    """QLoRA's shape: a frozen quantized base whose autograd function saves its scale but keeps its
    codes on ctx, as bitsandbytes does with the 4-bit weight. Backward reads the codes although torch
    never saw them saved, so ZeRO-3 must have them gathered for the module's backward whatever the
    recompute saved. v0.19.2: CheckpointError (the scale, recomputed with shape [0])."""
    config = lifecycle_config()
    factory = functools.partial(models.quantized_lora_stack, DIM, 2, checkpointing)
    return _build_and_train(factory, config)


def no_grad_input(*, checkpointing="module", gas=2, steps=2):
    """The first block is fed an input that needs no grad (frozen embeddings in front of it), with
    gradient accumulation: every micro-batch's backward must release everything by itself.
    v0.19.2: the first block's trainable params stay gathered after backward (its post-backward
    hook is never armed) and the available-parameter counter goes negative."""
    config = lifecycle_config(gas=gas)
    factory = functools.partial(models.scaled_stack, DIM, 2, checkpointing)
    return _build_and_train(factory,
                            config,
                            inputs=lambda engine: _inputs(engine, requires_grad=False),
                            steps=steps,
                            gas=gas)


def no_grad_pass_through(*, checkpointing="module"):
    """A module called under torch.no_grad() returns its input unchanged; the head reads that
    tensor. v0.19.2: ZeRO-3's backward-hook Functions hand the caller a detached copy, so the blocks
    get no gradient (0 against the reference) and the head stays gathered after backward."""
    factory = functools.partial(models.no_grad_probe_stack, DIM, 2, checkpointing)
    return _build_and_train(factory, lifecycle_config())


def no_grad_module_reenabling_grad(*, checkpointing="module"):
    """A module called under torch.no_grad() turns grad back on inside its forward and uses its
    own trainable parameters there (an open problem, found by review). v0.19.2 and v0.19.8: the
    pre-backward wrapping detaches its output, so every module before it and its own parameters
    get wrong gradients, silently. With 0008 (PR 7), which leaves a no_grad invocation to torch,
    its pre-backward is not armed either, and backward reads its parameter partitioned:
    RuntimeError (size of tensor a (8) must match b (0))."""
    factory = functools.partial(models.no_grad_probe_stack, DIM, 2, checkpointing, reenables_grad=True)
    return _build_and_train(factory, lifecycle_config())


def persistent_norms(*, checkpointing="module", steps=3):
    """stage3_param_persistence_threshold makes exactly the frozen norms persistent (the Linears
    have no bias). While the first step records the trace, ZeRO-3 releases persistent parameters
    like any other, as v0.19.2 does (trainable persistent parameters must keep that behaviour,
    invariant I6); the recompute keeps the frozen ones gathered for backward like any frozen
    parameter, so the first step trains. From the second step on they stay gathered; everything
    else is released after each backward. v0.19.2: CheckpointError in the first backward (the
    recompute partitions the frozen persistent norm it recorded)."""
    config = lifecycle_config(persistence=DIM)
    factory = functools.partial(models.frozen_norm_stack, DIM, 2, checkpointing, bias=False)
    engine, reference = build(factory, config)
    norms = [p for name, p in engine.module.named_parameters() if ".norm." in name]
    others = [p for name, p in engine.module.named_parameters() if ".norm." not in name]
    assert norms and all(p.ds_persist for p in norms), "the norms should be persistent"
    assert not any(p.ds_persist for p in others), "only the norms should be persistent"

    forwards = []

    def count_forward(engine):
        forwards.append(len(forwards))
        norms_resident(engine)

    def norms_resident(engine):
        if len(forwards) < 2:  # the first step records the trace
            return
        partitioned = [p.ds_id for p in norms if p.ds_status != ZeroParamStatus.AVAILABLE]
        assert not partitioned, f"persistent norm params {partitioned} were partitioned in step {len(forwards) - 1}"

    result = train(engine,
                   reference,
                   _inputs(engine),
                   steps=steps,
                   after_forward=count_forward,
                   after_backward=norms_resident)
    engine.destroy()
    return result


def z3_leaf_multi_output(*, checkpointing="module"):
    """A z3 leaf module returning two tensors (its backward hooks fire from several autograd
    threads). v0.19.2: CheckpointError."""
    config = lifecycle_config()

    def factory():
        model = models.LeafModel(DIM, checkpointing)
        deepspeed.utils.set_z3_leaf_modules(model, [models.TwoBranchLeaf])
        return model

    return _build_and_train(factory, config)


def fast_sharding(*, checkpointing="function-relu"):
    """stage3_module_granularity_threshold makes the blocks z3 leaves with fast sharding, which
    swaps a released param's data for a 1-element buffer; a relu after each block inside the
    checkpointed region makes the recompute run the blocks' post-forward.
    v0.19.2: CheckpointError."""
    # a NormLinear block has 88 params in 3 layers (granularity 29); the wide head keeps the root's
    # granularity above that, so exactly the blocks become leaves
    config = lifecycle_config(stage3_module_granularity_threshold=29)

    def factory():
        stack = models.frozen_norm_stack(DIM, 2, checkpointing)
        stack.head = torch.nn.Linear(DIM, 64)
        return stack

    engine, reference = build(factory, config)
    leaves = [m for m in engine.module.modules() if getattr(m, "_z3_leaf", False)]
    assert leaves == list(engine.module.blocks), f"expected the blocks to be the z3 leaves, got {leaves}"
    result = train(engine, reference, _inputs(engine))
    engine.destroy()
    return result


def leaf_no_grad_input(*, leaves="fast-sharding", checkpointing="module", steps=2):
    """Two blocks made z3 leaves (by fast sharding, stage3_module_granularity_threshold, or by
    set_z3_leaf_modules) fed an input that needs no grad, as frozen embeddings feed a first layer.
    v0.19.2 and v0.19.8: the leaf's grads are reduced by a full backward hook that torch fires before
    the leaf's backward when no input needs grad, so RuntimeError in the first backward ("output with
    shape [1] doesn't match the broadcast shape", shape [0] without fast sharding), checkpointing or not."""
    if leaves == "fast-sharding":
        # a NormLinear block has 88 params in 3 layers (granularity 29); the wide head keeps the root's
        # granularity above that, so exactly the blocks become leaves
        config = lifecycle_config(stage3_module_granularity_threshold=29)
    elif leaves == "set_z3_leaf_modules":
        config = lifecycle_config()
    else:
        raise ValueError(f"leaves={leaves!r}: expected 'fast-sharding' or 'set_z3_leaf_modules'")

    def factory():
        stack = models.frozen_norm_stack(DIM, 2, checkpointing)
        stack.head = torch.nn.Linear(DIM, 64)
        if leaves == "set_z3_leaf_modules":
            deepspeed.utils.set_z3_leaf_modules(stack, [models.NormLinear])
        return stack

    engine, reference = build(factory, config)
    try:
        found = [m for m in engine.module.modules() if getattr(m, "_z3_leaf", False)]
        assert found == list(engine.module.blocks), f"expected the blocks to be the z3 leaves, got {found}"
        return train(engine, reference, _inputs(engine, requires_grad=False), steps=steps)
    finally:
        engine.destroy()


def z3_leaf_without_backward(*, leaf="frozen", steps=3):
    """A frozen z3 leaf block with no backward (called plainly or under no_grad) before a trainable
    head, fed an input that needs no grad, under DeepSpeed's default reuse distance (prefetch and
    persistence stay off). v0.19.2 and v0.19.8: the block's params stay gathered after the backward
    of step 1 (a z3 leaf's release counted the params of later modules in the trace recursively,
    its ancestors' included, as reused)."""
    config = lifecycle_config(stage3_max_reuse_distance=1_000_000_000)  # DeepSpeed's default

    def factory():
        model = models.BlockWithoutBackward(DIM, leaf)
        deepspeed.utils.set_z3_leaf_modules(model, [models.NormLinear])
        return model

    engine, reference = build(factory, config)
    try:
        return train(engine, reference, _inputs(engine, requires_grad=False), steps=steps)
    finally:
        engine.destroy()


def z3_leaf_mapping_output(*, output="dict", input_grad=True, steps=2):
    """Two z3 leaf blocks returning a dict or a list (``output``), before a trainable head, fed an
    input that requires grad or not. Torch calls the full backward hook that reduces a z3 leaf's
    grads only for a Tensor or tuple output. v0.19.2 and v0.19.8: the leaves' grads are never
    reduced (wrong gradients at 2 ranks, "unknown parameter type" at the step at world size 1)."""
    config = lifecycle_config()

    def factory():
        model = models.MappingOutputStack(DIM, output)
        deepspeed.utils.set_z3_leaf_modules(model, [models.MappingOutputBlock])
        return model

    return _build_and_train(factory, config, inputs=functools.partial(_inputs, requires_grad=input_grad), steps=steps)


def reentered_module(*, checkpointing="module"):
    """One block applied three times per forward (a module invoked again before its backward).
    v0.19.2: CheckpointError."""
    config = lifecycle_config()
    factory = functools.partial(models.frozen_norm_stack, DIM, 1, checkpointing, repeat=3)
    return _build_and_train(factory, config)


def forward_stack_bounded(*, steps=3):
    """Non-reentrant early stop cuts the recompute short inside each block, so the recomputed
    modules never pop themselves off FWD_MODULE_STACK. Fully trainable model, which v0.19.2 trains:
    there, the stack grows by the interrupted modules every step."""
    config = lifecycle_config()
    factory = functools.partial(models.trainable_stack, DIM, 3, "module")
    engine, reference = build(factory, config)
    lengths = []

    def stack_clean(engine):
        lengths.append(len(parameter_offload.FWD_MODULE_STACK))
        assert_forward_stack_clean(engine, f"after forward {len(lengths)}")

    result = train(engine, reference, _inputs(engine), steps=steps, after_forward=stack_clean)
    engine.destroy()
    result["stack_lengths"] = lengths
    return result


def exception_in_recompute():
    """The recompute raises in the middle of the block; then the same step is retried.
    The retry must start clean (ledger empty, nothing gathered, stack bounded) and train exactly
    like the reference. v0.19.2: the retry crashes with CheckpointError."""
    config = lifecycle_config()
    factory = lambda: models.Stack([models.FailingBlock(DIM) for _ in range(2)], DIM, "module")
    engine, reference = build(factory, config)
    make_inputs = _inputs(engine)

    engine.module.blocks[1].fail_in_recompute = True
    loss = engine(*make_inputs(0))
    try:
        engine.backward(loss)
    except RuntimeError as error:
        assert "injected failure during the recompute" in str(error), error
    else:
        raise AssertionError("the injected recompute failure did not surface")
    engine.module.blocks[1].fail_in_recompute = False
    discard_aborted_backward(engine)

    def starts_clean(engine):
        assert_forward_stack_clean(engine, "after the retried forward")
        assert not outstanding_releases(engine), "the ledger should have been drained at the next forward"

    result = train(engine, reference, make_inputs, steps=2, after_forward=starts_clean)
    engine.destroy()
    return result


def undetectable_recompute():
    """On a torch that lacks torch._C._current_graph_task_id (simulated by hiding it from ZeRO-3),
    ZeRO-3 cannot recognise a checkpoint recompute: it says so once, when the engine is built,
    and the recompute fails as on v0.19.2, with torch's own CheckpointError, type unchanged.
    v0.19.2: the same CheckpointError, with no warning."""
    import logging
    from deepspeed.runtime.zero import partitioned_param_coordinator
    from deepspeed.utils import logger

    warnings = []
    handler = logging.Handler()
    handler.emit = lambda record: warnings.append(record.getMessage())
    logger.addHandler(handler)
    hidden = getattr(partitioned_param_coordinator, "_current_graph_task_id", None)
    partitioned_param_coordinator._current_graph_task_id = None
    try:
        config = lifecycle_config()
        engine, _ = build(functools.partial(models.frozen_norm_stack, DIM, 2, "module"), config)
        loss = engine(*_inputs(engine)(0))
        with pytest.raises(torch.utils.checkpoint.CheckpointError, match=r"torch.Size\(\[0\]\)"):
            engine.backward(loss)
    finally:
        partitioned_param_coordinator._current_graph_task_id = hidden
        logger.removeHandler(handler)
    discard_aborted_backward(engine)
    engine.destroy()
    said = [w for w in warnings if "cannot recognise activation checkpointing recomputes" in w]
    assert len(said) == 1, f"expected one warning about the missing recompute detection, got {said}"
    assert "use_reentrant=True" in said[0], said[0]
    return {"warning": said[0]}


def exception_in_backward():
    """A backward node raises after the block's recompute (with the frozen norm gathered for it);
    the next step must start clean and train exactly like the reference. v0.19.2: CheckpointError
    in the first backward already."""
    config = lifecycle_config()
    factory = lambda: models.Stack([models.FailInBackwardBlock(DIM) for _ in range(2)], DIM, "module")
    engine, reference = build(factory, config)
    make_inputs = _inputs(engine)

    engine.module.blocks[0].armed[0] = True
    loss = engine(*make_inputs(0))
    try:
        engine.backward(loss)
    except RuntimeError as error:
        assert "injected failure in backward" in str(error), error
    else:
        raise AssertionError("the injected backward failure did not surface")
    engine.module.blocks[0].armed[0] = False
    discard_aborted_backward(engine)

    def starts_clean(engine):
        assert not outstanding_releases(engine), "the ledger should have been drained at the next forward"
        gathered = frozen_available(engine)
        assert not gathered, f"frozen params left gathered by the failed backward: {gathered}"

    result = train(engine, reference, make_inputs, steps=2, after_forward=starts_clean)
    engine.destroy()
    return result


def several_forwards_one_backward(*, frozen=True, checkpointing="module"):
    """Two forwards, then one backward of the summed losses. v0.19.2: CheckpointError with frozen
    norms; without them (and without checkpointing), every module's post-backward counts only its
    last invocation's input grads, runs once, and the other invocation's pre-backward leaves the
    parameters gathered until the optimizer step."""
    config = lifecycle_config()
    stack = models.frozen_norm_stack if frozen else models.trainable_stack
    factory = functools.partial(stack, DIM, 2, checkpointing)
    engine, reference = build(factory, config)
    for step in range(2):
        xs = [batch(2 * step + i, (2, DIM), device=engine.device) for i in range(2)]
        loss = engine(xs[0]) + engine(xs[1])
        engine.backward(loss)
        # the head runs twice before backward: each invocation needs its own post-backward
        assert_quiescent(engine, f"after the backward of step {step}")
        reference.zero_grad()
        (reference(xs[0].detach().requires_grad_()) + reference(xs[1].detach().requires_grad_())).backward()
        assert_grads_match(engine, reference_grads(reference), exact=True)
        engine.step()
        sync_reference(engine, reference)
        assert_quiescent(engine, f"after optimizer step {step}")
    engine.destroy()
    return {}


def external_params(*, checkpointing="module"):
    """A child returns its own frozen parameter, which ZeRO-3 registers as external to the parent.
    v0.19.2: CheckpointError (the parent's frozen norm)."""
    config = lifecycle_config()
    factory = functools.partial(models.external_param_stack, DIM, 2, checkpointing)
    return _build_and_train(factory, config)


def returned_param_after_forward_function(*, checkpointing="function"):
    """A module returns its own trainable scale, called first through its forward function (under
    checkpointing or plainly: its hooks do not run, and ZeROOrderedDict registers the scale as an
    external parameter of the caller when the forward reads it), then as a module. v0.19.2: the
    module's post-forward partitions the scale it returns (RuntimeError in the forward, size 0)."""
    config = lifecycle_config()
    factory = functools.partial(models.ReturnedParamCaller, DIM, checkpointing)
    return _build_and_train(factory, config)


def returned_param_with_unused_sibling():
    """A module fed an input that needs no grad, with trainable params only, returns its expert's
    output and its own scale and leaves its shift unused: its post-backward runs once its grads are
    accumulated, which the returned scale's output reaches first; the expert's output reaching its
    pre-backward afterwards must not gather the shift again. v0.19.2 leaves it gathered too."""
    config = lifecycle_config()
    factory = functools.partial(models.ScaledExpertCaller, DIM)
    return _build_and_train(factory,
                            config,
                            inputs=functools.partial(_inputs, requires_grad=False),
                            steps=3,
                            unused_params=("block.shift", ))


def shared_layer_checkpointed_both_ways(*, early_stop=False):
    """A block fed an input that needs no grad applies one shared Linear through its forward
    function under non-reentrant checkpointing, then as a module under reentrant checkpointing.
    The reentrant checkpoint's nested backward accumulates the weight's gradient first; the block's
    post-backward must wait for the outer backward, whose recompute of the forward function reads
    the weight again. v0.19.2 and the first thirteen patches: the weight is reduced twice in one
    backward (AssertionError in __reduce_and_partition_ipg_grads), which 0014 adds up; with a
    trigger that counts the nested backward's accumulation, the recompute reads the weight
    partitioned (RuntimeError, "mat2 must be a matrix", without the early stop)."""
    config = lifecycle_config()
    factory = functools.partial(models.SharedLayerCaller, DIM, early_stop)
    return _build_and_train(factory, config, inputs=functools.partial(_inputs, requires_grad=False), steps=3)


def reentrant_detached_frozen():
    """use_reentrant=True with a frozen norm fed a detached tensor inside the region: nothing of
    the norm is saved for backward, so it must be released, not kept. v0.19.2 works (guard); the
    minimal coordinator skip leaves the norm gathered."""
    config = lifecycle_config()

    factory = functools.partial(models.detaching_stack, DIM, 2, "reentrant")
    return _build_and_train(factory, config)


def frozen_peak(*, checkpointing="module", depth=4):
    """The most frozen parameters gathered at once during backward stays within one block
    (2 = one norm's weight and bias). Observed from probes before and after every norm. v0.19.2:
    CheckpointError for non-reentrant; 2 for reentrant (guard). The upstream 0.19.3 fix gathers
    the whole frozen base (2 * depth) for function-level and reentrant checkpointing."""
    config = lifecycle_config()
    factory = functools.partial(models.frozen_norm_stack, DIM, depth, checkpointing, True)
    engine, reference = build(factory, config)
    peak = [0]
    seen = []

    def observe():
        gathered = frozen_available(engine)
        seen.append(gathered)
        peak[0] = max(peak[0], len(gathered))

    for block in engine.module.blocks:
        block.observer = observe
        block.inner_observer = observe
    result = train(engine, reference, _inputs(engine), steps=2)
    engine.destroy()
    assert seen, "the probes never ran"
    assert peak[
        0] <= 2, f"{peak[0]} frozen params gathered at once in backward (one block has 2): {max(seen, key=len)}"
    result["frozen_peak"] = peak[0]
    return result


def prompt_release(*, checkpointing="module"):
    """Right after its consumer's backward (LayerNormBackward), a frozen norm weight is released:
    a probe placed just before the norm runs next in backward and sees it partitioned.
    v0.19.2: CheckpointError."""
    config = lifecycle_config()
    factory = functools.partial(models.frozen_norm_stack, DIM, 2, checkpointing, True)
    engine, reference = build(factory, config)
    observations = []

    def make_observer(block):

        def observe():
            observations.append((block.norm.weight.ds_status, block.norm.bias.ds_status))

        return observe

    for block in engine.module.blocks:
        block.observer = make_observer(block)
    result = train(engine, reference, _inputs(engine))
    engine.destroy()
    assert observations, "the probes never ran"
    late = [o for o in observations if o != (ZeroParamStatus.NOT_AVAILABLE, ZeroParamStatus.NOT_AVAILABLE)]
    assert not late, f"frozen norm params still gathered right after their last backward use: {late}"
    result["observations"] = len(observations)
    return result


def no_backward_consumer(*, checkpointing="module"):
    """A frozen embedding looked up by ids inside a checkpointed block has no backward consumer:
    it must be released as soon as its recompute use ends, i.e. it is already partitioned when the
    block's Linear has finished its backward. v0.19.2 does that too (guard)."""
    config = lifecycle_config()
    factory = functools.partial(models.EmbeddingModel, 16, DIM, checkpointing)
    engine, reference = build(factory, config)
    observations = []
    engine.module.block.observer = lambda: observations.append(engine.module.block.embed.weight.ds_status)

    def make_inputs(step):
        ids = torch.randint(0, 16, (2, ), generator=torch.Generator().manual_seed(step)).to(engine.device)
        return ids, batch(step, (2, DIM), device=engine.device)

    result = train(engine, reference, make_inputs)
    engine.destroy()
    assert observations, "the probe never ran"
    assert all(s == ZeroParamStatus.NOT_AVAILABLE
               for s in observations), (f"the frozen embedding was still gathered during backward: {observations}")
    return result


def embedding_without_backward(*, checkpointing="module"):
    """Frozen input embeddings whose output a forward hook makes require grad (transformers'
    enable_input_require_grads()) have no backward, so backward must gather nothing of theirs.
    v0.19.2: the embedding's pre-backward all-gathers its weight in every backward, for nothing
    (a 7B Llama's bf16 embedding table: 0.24 GiB per step)."""
    config = lifecycle_config()
    factory = functools.partial(models.InputGradsEmbeddingModel, 16, DIM, 2, checkpointing)
    engine, reference = build(factory, config)
    counts = count_all_gathers(engine.module)  # the embedding is the only frozen parameter
    after_forward, gathered_in_backward = {}, []

    def make_inputs(step):
        return (torch.randint(0, 16, (2, ), generator=torch.Generator().manual_seed(step)).to(engine.device), )

    result = train(engine,
                   reference,
                   make_inputs,
                   after_forward=lambda engine: after_forward.update(counts),
                   after_backward=lambda engine: gathered_in_backward.append(counts["frozen"] - after_forward["frozen"]))
    engine.destroy()
    assert gathered_in_backward, "no backward ran"
    assert not any(gathered_in_backward), (f"the frozen embedding was all-gathered in backward: "
                                           f"{gathered_in_backward} bytes per backward")
    return result


def all_gather_volume(*, steps=3):
    """Frozen-param all-gather volume per step with non-reentrant checkpointing equals the volume
    without checkpointing: the recompute's gather is reused by the module's backward.
    v0.19.2: CheckpointError."""
    volumes = {}
    for checkpointing in ("none", "module"):
        config = lifecycle_config()
        factory = functools.partial(models.lora_stack, DIM, 2, checkpointing)
        engine, reference = build(factory, config)
        counts = count_all_gathers(engine.module)
        per_step = []

        def snapshot(engine):
            per_step.append(dict(counts))

        train(engine, reference, _inputs(engine), steps=steps, after_backward=snapshot)
        engine.destroy()
        deltas = [{k: b[k] - a[k] for k in b} for a, b in zip([{"frozen": 0, "trainable": 0}] + per_step, per_step)]
        volumes[checkpointing] = deltas
    for step in range(1, steps):  # step 0 records the trace
        frozen_ckpt = volumes["module"][step]["frozen"]
        frozen_plain = volumes["none"][step]["frozen"]
        assert frozen_ckpt == frozen_plain, (f"step {step}: checkpointing all-gathered {frozen_ckpt} bytes of frozen "
                                             f"params, without checkpointing {frozen_plain}")
    return volumes


def full_finetune_lifecycle_trace(*, golden, checkpointing="module", record=False, defaults=False):
    """No frozen params at all: trains exactly like the reference, and every gather and release, in
    order, with the gathered numel after each (the memory profile of gathered parameters), must be
    v0.19.2's. ``golden`` is the JSON file with v0.19.2's trace; ``record=True`` (on pristine
    v0.19.2 only) writes it instead (rank 0). Inputs require grad: for a block input that needs no
    grad the series changes the release on purpose (0003). Guard: v0.19.2 matches its own
    recording.

    ``defaults=True`` keeps DeepSpeed's default persistence threshold, prefetch bucket and reuse
    distance, with a hidden size (320) that puts the Linear weights (102400 numel) above the
    default persistence threshold (1e5) and the norms and biases below it: persistent and
    released parameters side by side, prefetching and reuse as in production."""
    config = lifecycle_config(defaults=defaults)
    dim = DEFAULTS_DIM if defaults else DIM
    factory = functools.partial(models.trainable_stack, dim, 2, checkpointing)
    engine, reference = build(factory, config)
    trace = record_lifecycle_trace(engine.module)
    # the counter is 0001's to fix (v0.19.2 drives it negative under the defaults); this compares traces
    train(engine, reference, _inputs(engine, shape=(2, dim)), steps=2, counter=not defaults)
    engine.destroy()
    if record:
        if deepspeed.comm.get_rank() == 0:
            with open(golden, "w") as out:
                json.dump({"checkpointing": checkpointing, "recorded_on": f"deepspeed {deepspeed.__version__.strip()}",
                           "trace": trace}, out, indent=1)
                out.write("\n")
        return {"events": len(trace)}
    with open(golden) as recorded:
        expected = json.load(recorded)["trace"]
    first_difference = next((i for i, (a, b) in enumerate(zip(trace, expected)) if a != b), min(len(trace), len(expected)))
    assert trace == expected, (f"gathers and releases differ from v0.19.2's ({golden}) from event {first_difference} on "
                               f"({len(trace)} events vs {len(expected)}): got {trace[first_difference:first_difference + 4]}, "
                               f"v0.19.2 had {expected[first_difference:first_difference + 4]}")
    return {"events": len(trace)}


def eval_forward():
    """An eval forward under no_grad between training steps gathers and releases as before and
    leaves nothing behind (guard: fully trainable model, which v0.19.2 trains)."""
    config = lifecycle_config()
    factory = functools.partial(models.trainable_stack, DIM, 2, "module")
    engine, reference = build(factory, config)
    make_inputs = _inputs(engine)
    result = train(engine, reference, make_inputs, steps=1)
    engine.eval()
    with torch.no_grad():
        engine(*make_inputs(99))
    assert_quiescent(engine, "after an eval forward")
    engine.train()
    result = train(engine, reference, make_inputs, steps=1)
    engine.destroy()
    return result


def gradient_penalty_in_region(*, checkpointing="module", first_layer="linear"):
    """A checkpointed block that calls torch.autograd.grad in its forward: the recompute runs that
    backward again, through the graph it records. A first layer that keeps its weight on ctx
    ("stashed") must find it gathered there; torch's linear saves a view of it. Guard: a fully
    trainable model, which v0.19.2 trains. v0.19.2 keeps the first layer of each block gathered
    from that backward to the optimizer step, the series too: quiescence is checked there."""
    factory = functools.partial(models.gradient_penalty_stack, DIM, 2, checkpointing, first_layer == "stashed")
    return _build_and_train(factory, lifecycle_config(), quiescent_after_backward=False)


def counter_across_steps(*, checkpointing="none", steps=3):
    """No frozen parameter, DeepSpeed's default ZeRO-3 settings: the available-parameter counter
    must never go negative. v0.19.2 zeroes it at every root forward while parameters gathered in
    the previous step are still gathered (persistent ones, those kept by the reuse distance), and
    subtracts them again when they are released: it ends negative after the first step."""
    config = lifecycle_config(defaults=True)
    factory = functools.partial(models.trainable_stack, DIM, 2, checkpointing)
    return _build_and_train(factory, config, steps=steps)


def unused_output_warned_once(*, steps=3):
    """A frozen module whose output the loss does not use is recomputed in backward, so its
    frozen parameters are held for a backward that never comes: the end of the graph task
    releases them (nothing stays gathered) and says so once for that module, not once per step.
    v0.19.2: CheckpointError."""
    import logging
    from deepspeed.utils import logger

    config = lifecycle_config()
    engine, reference = build(lambda: models.Stack([models.UnusedOutputBlock(DIM) for _ in range(2)], DIM), config)
    coordinator_of(engine).strict_release_checks = False  # a legitimately unused output is no bug
    warnings = []
    handler = logging.Handler()
    handler.emit = lambda record: warnings.append(record.getMessage())
    logger.addHandler(handler)
    try:
        result = train(engine, reference, _inputs(engine), steps=steps)
    finally:
        logger.removeHandler(handler)
        engine.destroy()
    late = [w for w in warnings if "only at the end of backward" in w]
    assert len(late) == 1, f"expected one late-release warning in {steps} steps, got {len(late)}: {late}"
    assert "aux_norm" in late[0], late[0]
    result["warning"] = late[0]
    return result


def dropped_side_output(*, checkpointing="module", steps=2):
    """A frozen side projection whose output a trainable reader reads detached, inside checkpointed
    blocks: nothing of it has a backward, so what its recompute gathers is released by its
    post-forward, not at the end of backward (strict release checks raise there). v0.19.2 leaves
    the reader gathered; with the first sixteen patches the side projection is released late."""
    config = lifecycle_config()
    factory = lambda: models.Stack([models.DroppedSideOutputBlock(DIM) for _ in range(2)], DIM, checkpointing)
    return _build_and_train(factory, config, steps=steps)


def kwargs_input(*, checkpointing="module", inputs="keyword"):
    """Blocks whose grad-requiring input arrives as a keyword argument (or through an attribute,
    ``inputs="stash"``), with a frozen weight that their backward reads after the trainable
    scale's gradient is accumulated: every block's post-backward must wait for its whole backward.
    v0.19.2: the blocks' post-backward is never armed (a forward pre-hook without kwargs sees no
    input), their parameters stay gathered."""
    config = lifecycle_config()
    return _build_and_train(functools.partial(models.KwargsStack, DIM, 2, checkpointing, inputs), config)


def shared_frozen_norm_mixed_invocations():
    """One frozen norm invoked on hidden states (armed through its input) and on a no-grad tensor
    whose output a hook makes a leaf: each invocation's pre-backward must do its own thing (the
    first gathers the norm for its backward). Guard for v0.19.2, which gathers in both."""
    config = lifecycle_config()
    return _build_and_train(functools.partial(models.SharedFrozenNormModel, DIM), config)


def direct_loss_backward(*, checkpointing="module", steps=2):
    """loss.backward() instead of engine.backward(loss), as some training loops do: the same
    lifecycle without the engine's backward wrapper. v0.19.2: CheckpointError."""
    config = lifecycle_config()
    engine, reference = build(functools.partial(models.frozen_norm_stack, DIM, 2, checkpointing), config)
    make_inputs = _inputs(engine)
    for step in range(steps):
        (x, ) = make_inputs(step)
        engine(x).backward()
        assert_quiescent(engine, f"after loss.backward() of step {step}")
        reference.zero_grad()
        reference(x.detach().requires_grad_()).backward()
        assert_grads_match(engine, reference_grads(reference), exact=True, when=f"in step {step}")
        engine.step()
        sync_reference(engine, reference)
        assert_quiescent(engine, f"after optimizer step {step}")
    engine.destroy()
    return {}


def cpu_param_offload(*, checkpointing="module", defaults=False):
    """offload_param to CPU: the parameters' partitions live on the host, a gather copies them in.
    v0.19.2: CheckpointError."""
    config = lifecycle_config(defaults=defaults, offload_param={"device": "cpu"})
    factory = functools.partial(models.frozen_norm_stack, DIM, 2, checkpointing)
    return _build_and_train(factory, config, steps=3 if defaults else 2)


def engine_compile(*, checkpointing="module"):
    """engine.compile() (torch.compile of the module with ZeRO-3's hooks; the "eager" backend, so
    that no C++ compiler is needed on CPU) trains frozen norms under checkpointing.
    v0.19.2: CheckpointError."""
    config = lifecycle_config()
    engine, reference = build(functools.partial(models.frozen_norm_stack, DIM, 2, checkpointing), config)
    engine.compile(backend="eager")
    result = train(engine, reference, _inputs(engine))
    engine.destroy()
    return result


def engine_compile_of_outputs_that_need_no_grad():
    """engine.compile() of a frozen layer fed inputs that need no grad, then a trainable head: the
    frozen layer's output needs no grad, and torch.compile would inline the autograd function that
    ZeRO-3's pre-backward hook applies to it, were the hook traced (one whose input requires grad
    breaks the graph)."""
    config = lifecycle_config()
    engine, reference = build(functools.partial(models.FrozenLayerThenHead, DIM), config)
    engine.compile(backend="eager")
    result = train(engine, reference, _inputs(engine, requires_grad=False))
    engine.destroy()
    return result


class _ExpertsByRoute(torch.nn.Module):
    """Two experts, of which the forward runs the one ``route`` names (a router that, per rank,
    picks different experts: what MoE layers do), on its input detached (a stop-gradient)."""

    def __init__(self, dim):
        super().__init__()
        self.experts = torch.nn.ModuleList(torch.nn.Linear(dim, dim) for _ in range(2))
        self.route = 0

    def forward(self, x):
        return torch.tanh(self.experts[self.route](x.detach()))


class _ExpertsCutFromInput(torch.nn.Module):

    def __init__(self, dim):
        super().__init__()
        self.moe = _ExpertsByRoute(dim)
        self.head = torch.nn.Linear(dim, 1)

    def forward(self, x):
        return self.head(self.moe(x)).pow(2).mean()


def z3_leaf_experts_routed_by_rank(*, steps=2):
    """A z3 leaf of two experts whose output does not depend on its input, which requires grad,
    so that torch never calls the leaf's backward hook; each rank routes its batch to the expert
    of its rank's parity. Every rank must reduce every parameter of the leaf, whichever its own
    batch used, or the ranks' reductions do not match: the expected gradient is the mean over
    ranks of the torch reference routed as each rank. v0.19.2 and v0.19.8: the leaf's grads are
    never reduced."""
    config = lifecycle_config()

    def factory():
        model = _ExpertsCutFromInput(DIM)
        deepspeed.utils.set_z3_leaf_modules(model, [_ExpertsByRoute])
        return model

    engine, reference = build(factory, config)
    rank, world = dist.get_rank(), dist.get_world_size()
    engine.module.moe.route = rank % 2
    for step in range(steps):
        x = batch(step, (2, DIM), device=engine.device)
        engine.backward(engine(x))
        assert_quiescent(engine, f"after backward of step {step}")
        expected = {}
        for route in range(world):
            reference.zero_grad()
            reference.moe.route = route % 2
            reference(x).backward()
            for name, param in reference.named_parameters():
                grad = param.grad if param.grad is not None else torch.zeros_like(param)
                expected[name] = expected.get(name, 0) + grad / world
        for name, param in engine.module.named_parameters():
            torch.testing.assert_close(full_grad(param).float().cpu(), expected[name].float().cpu(),
                                       msg=lambda m, name=name: f"{name} in step {step}: {m}")
        engine.step()
        sync_reference(engine, reference)
    engine.destroy()
    return {"steps": steps}


def deepspeed_checkpointing(*, api="checkpoint", synchronize=False, profile=False, steps=2):
    """DeepSpeed's own activation checkpointing (deepspeed.checkpointing.checkpoint or
    non_reentrant_checkpoint, as Megatron-DeepSpeed calls them) of frozen-norm blocks after a frozen
    embedding, with configure()'s synchronize option (its profile option fails on v0.19.2's
    non_reentrant_checkpoint with or without ZeRO-3's series: "backward timer has already been
    started"). v0.19.8: non_reentrant_checkpoint
    crashes in the first backward (RuntimeError: The size of tensor a (0) must match the size of
    tensor b (8)), as does v0.19.2 (on CPU with _accelerator_stream_stand_in). configure()'s
    partition_activations needs a model-parallel mpu: without one it fails the same on both releases,
    patched or not and without ZeRO-3 (The size of tensor a (128) must match the size of tensor b)."""
    vocab = 16
    deepspeed.checkpointing.configure(None, synchronize=synchronize, profile=profile)
    config = lifecycle_config()
    factory = functools.partial(models.EmbeddingNormStack, vocab, DIM, 2,
                                "deepspeed" if api == "checkpoint" else "deepspeed-non-reentrant")

    def ids(engine):
        return lambda step: (torch.randint(0, vocab, (2, 4), generator=torch.Generator().manual_seed(step)).to(
            engine.device), )

    with _accelerator_stream_stand_in():
        return _build_and_train(factory, config, inputs=ids, steps=steps)


@contextlib.contextmanager
def _accelerator_stream_stand_in():
    """v0.19.2's deepspeed.checkpointing creates an accelerator Stream on every call and never uses
    it (the code that would is commented out); the CPU accelerator has none (its Stream is None), so
    there both functions fail with "TypeError: 'NoneType' object is not callable" before ZeRO-3 is
    reached. v0.19.8 creates none. On such an accelerator, for the scenario's duration, Stream makes
    None instead, so that the scenario tests ZeRO-3 on CPU as it does on a GPU."""
    accelerator = type(get_accelerator())
    if get_accelerator().Stream is not None:
        yield
        return
    original = accelerator.__dict__["Stream"]
    accelerator.Stream = property(lambda self: lambda *args, **kwargs: None)
    try:
        yield
    finally:
        accelerator.Stream = original


def recompute_makes_no_backward_functions(*, checkpointing="module"):
    """LoRA blocks under torch's non-reentrant checkpoint. The engine runs backward through the graph
    of the forward; the graph the recompute builds only yields the tensors the forward saved. So
    every pre-backward that ZeRO-3 counts on a module (applied_pre_backward_ref_cnt) runs in that
    backward, and none is left counted after it: the recompute arms none. v0.19.2: CheckpointError
    (recomputed shape [0]) in the first backward; with a recompute that wraps the recomputed outputs
    for a pre-backward that never runs, each checkpointed module is left one count per step."""
    config = lifecycle_config()
    factory = functools.partial(models.lora_stack, DIM, 2, checkpointing)
    engine, reference = build(factory, config)

    def no_pre_backward_left(engine):
        left = {name: module.__dict__.get("applied_pre_backward_ref_cnt", 0)
                for name, module in engine.module.named_modules()}
        left = {name: count for name, count in left.items() if count}
        assert not left, f"pre-backward counted and never run, by module: {left}"

    try:
        return train(engine, reference, _inputs(engine), steps=2, after_backward=no_pre_backward_left)
    finally:
        engine.destroy()


def input_gradient_penalty(*, graph="retain", model="checkpointed"):
    """torch.autograd.grad of the loss with respect to the model's input, outside the forward, then
    engine.backward: the forward's graph runs twice. ``graph="retain"`` keeps it for the second
    run (a gradient norm computed for logging), ``"create"`` differentiates the input gradient
    again (a penalty added to the loss). A fully trainable model. ``model="checkpointed"``: every
    module with parameters under a non-reentrant checkpoint, so both backwards recompute it; guard:
    v0.19.2 trains it exactly like the reference, leaving nothing gathered after backward.
    ``"repeated"``: no checkpointing, each block run twice; v0.19.2 fails the second backward (a
    parameter of size 0: the first one's post-backward released it and nothing gathers it again)."""
    if graph not in ("retain", "create"):
        raise ValueError(f"graph must be 'retain' or 'create', got {graph!r}")
    factories = {
        "checkpointed": functools.partial(models.fully_checkpointed_stack, DIM, 2),
        "repeated": lambda: models.Stack([models.NormLinear(DIM) for _ in range(2)], DIM, "none", repeat=2),
    }
    engine, reference = build(factories[model], lifecycle_config())

    def loss_of(net, x):
        out = net(x)
        (input_grad, ) = torch.autograd.grad(out, x, retain_graph=True, create_graph=graph == "create")
        return out + input_grad.pow(2).sum() if graph == "create" else out

    try:
        return train(engine, reference, _inputs(engine), loss_of=loss_of)
    finally:
        engine.destroy()


def input_gradient_of_one_branch(*, branches="first"):
    """A model of two inputs, each through a Linear, merged by a module that multiplies two
    Linears of them, then a head, every module checkpointed: torch.autograd.grad of the loss with
    respect to the input of each branch in ``branches`` ("first", or "both", one after the other),
    graph retained, then engine.backward. The merging module gets its input grads in different
    backwards. Guard: v0.19.2 trains it exactly like the reference, leaving nothing gathered."""
    order = {"first": (0, ), "both": (0, 1)}[branches]
    engine, reference = build(functools.partial(models.TwoBranchModel, DIM), lifecycle_config())

    def loss_of(net, *xs):
        out = net(*xs)
        for i in order:
            torch.autograd.grad(out, xs[i], retain_graph=True)
        return out

    def two_inputs(step):
        return tuple(batch(10 * step + i, (2, DIM), device=engine.device, requires_grad=True) for i in range(2))

    try:
        return train(engine, reference, two_inputs, loss_of=loss_of)
    finally:
        engine.destroy()
