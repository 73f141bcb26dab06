"""What every ZeRO-3 scenario shares: the engine, the reference model, and the lifecycle checks.

The checks read DeepSpeed's own bookkeeping. Where the patched tree adds state (the deferred-
release ledger, post-backward triggers), they read it with a default, so the same checks run on a
pristine v0.19.2 tree, where that state does not exist.
"""

import torch

import deepspeed
from deepspeed.accelerator import get_accelerator
from deepspeed.runtime.zero import parameter_offload
from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus
from deepspeed import comm as dist
from deepspeed.utils import safe_get_local_grad

from tests.scenarios import gradcompare

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def skip_unless_dtype_supported(dtype):
    """Returns a reason to skip, or None."""
    accelerator = get_accelerator()
    if dtype == "fp16" and not accelerator.is_fp16_supported():
        return f"fp16 is not supported by the {accelerator.device_name()} accelerator"
    if dtype == "bf16" and not accelerator.is_bf16_supported():
        return f"bf16 is not supported by the {accelerator.device_name()} accelerator"
    return None


def lifecycle_config(*, gas=1, dtype="fp32", persistence=0, defaults=False, micro_batch=2, **zero_overrides):
    """A ZeRO-3 config that releases every parameter as soon as ZeRO-3 can.

    DeepSpeed's default reuse distance and prefetch bucket keep a small model gathered from the
    second step on, which hides release bugs; ``defaults=True`` keeps DeepSpeed's defaults.
    """
    zero = {"stage": 3}
    if not defaults:
        zero.update(stage3_prefetch_bucket_size=0,
                    stage3_max_reuse_distance=0,
                    stage3_param_persistence_threshold=persistence)
    zero.update(zero_overrides)
    config = {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": gas,
        "optimizer": {
            "type": "Adam",
            "params": {
                "lr": 1e-2,
                "torch_adam": True
            }
        },
        "zero_optimization": zero,
    }
    if dtype == "bf16":
        config["bf16"] = {"enabled": True}
    elif dtype == "fp16":
        config["fp16"] = {"enabled": True, "initial_scale_power": 8}
    return config


def build(factory, config, *, zero_init=False, seed=1234):
    """Returns (ZeRO-3 engine, reference torch model) built from the same seed.

    With ``zero_init`` the ZeRO model is constructed under ``deepspeed.zero.Init``, which also
    swaps ``F.linear`` for DeepSpeed's own linear function (it saves the weight itself).
    """
    torch.manual_seed(seed)
    reference = factory()
    torch.manual_seed(seed)
    if zero_init:
        with deepspeed.zero.Init(config_dict_or_path=config):
            model = factory()
        load_reference_weights(model, reference)
    else:
        model = factory()
    engine = initialize(model, config)
    dtype = DTYPES[dtype_of(config)]
    reference = reference.to(device=engine.device, dtype=dtype)
    return engine, reference


def load_reference_weights(model, reference):
    """Gives a model built under zero.Init the reference's weights, before deepspeed.initialize
    copies them into the optimizer: zero.Init initialises on the accelerator, whose random
    generator differs from the CPU's, and Hugging Face initialises after construction, which
    partitioned parameters ignore.

    Each rank writes its own partition (DeepSpeed's layout: the flattened parameter cut into
    world-size equal parts, the last one zero-padded), so no collective is involved; DeepSpeed's
    GatheredParameters(modifier_rank=0) now and then failed to load on gloo.
    """
    rank = dist.get_rank()
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, ref_param in reference.named_parameters():
            param = params[name]
            if not hasattr(param, "ds_tensor"):  # added after zero.Init, converted by initialize
                param.data.copy_(ref_param.data.to(param.dtype))
                continue
            local = param.ds_tensor.data
            part = ref_param.data.flatten()[rank * local.numel():(rank + 1) * local.numel()]
            local.zero_()
            local[:part.numel()].copy_(part.to(device=local.device, dtype=local.dtype))


def initialize(model, config):
    trainable = [p for p in model.parameters() if p.requires_grad]
    engine, *_ = deepspeed.initialize(model=model, model_parameters=trainable, config=config)
    coordinator = coordinator_of(engine)
    # outstanding releases at the end of backward or at the step are errors in tests
    coordinator.strict_release_checks = True
    return engine


def dtype_of(config):
    if config.get("bf16", {}).get("enabled"):
        return "bf16"
    if config.get("fp16", {}).get("enabled"):
        return "fp16"
    return "fp32"


def offload_of(engine):
    return engine.optimizer.parameter_offload


def coordinator_of(engine):
    return offload_of(engine).get_param_coordinator()


def outstanding_releases(engine):
    """The deferred-release ledger's entries (none exist on a pristine tree)."""
    ledger = getattr(coordinator_of(engine), "outstanding_releases", None)
    return ledger() if ledger is not None else []


def available_numel_counter(engine):
    return coordinator_of(engine)._PartitionedParameterCoordinator__n_available_params


def lifecycle_violations(engine, counter=True):
    """Invariant I1 (quiescence), as a list of human-readable violations; with ``counter``, I7 too."""
    problems = []
    for name, param in engine.module.named_parameters():
        if param.ds_persist or param.is_external_param:
            continue
        if param.ds_status != ZeroParamStatus.NOT_AVAILABLE:
            problems.append(f"{name} is {param.ds_status.name} (requires_grad={param.requires_grad}, "
                            f"active modules {sorted(param.ds_active_sub_modules)})")
        elif param.ds_active_sub_modules:
            problems.append(f"{name} is partitioned but still claimed by modules "
                            f"{sorted(param.ds_active_sub_modules)}")
    for deferral in outstanding_releases(engine):
        problems.append(f"ledger still owes a release: {deferral}")
    triggers = getattr(offload_of(engine), "_post_backward_triggers", {})
    if triggers:
        problems.append(f"{len(triggers)} post-backward trigger(s) still armed")
    if counter and available_numel_counter(engine) < 0:
        problems.append(f"available-parameter counter is negative: {available_numel_counter(engine)}")
    return problems


def assert_quiescent(engine, when, counter=True):
    problems = lifecycle_violations(engine, counter)
    assert not problems, f"ZeRO-3 state is not quiescent {when}:\n  " + "\n  ".join(problems)


def assert_forward_stack_clean(engine, when):
    """After a completed root forward only the entry pushed at setup may remain (invariant I8)."""
    own = set(id(m) for m in engine.module.modules())
    stale = [type(m).__name__ for m in parameter_offload.FWD_MODULE_STACK if id(m) in own][1:]
    assert not stale, f"FWD_MODULE_STACK holds {len(stale)} stale entries {when}: {stale}"


def frozen_available(engine):
    """Names of frozen, non-persistent parameters that are gathered right now."""
    return sorted(name for name, p in engine.module.named_parameters()
                  if not p.requires_grad and not p.ds_persist and p.ds_status == ZeroParamStatus.AVAILABLE)


def batch(step, shape, *, device, dtype=torch.float32, requires_grad=True):
    """The same micro-batch on every rank, so ZeRO's data-parallel average of the gradients is
    exactly the single-process gradient."""
    generator = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(*shape, generator=generator).to(device=device, dtype=dtype)
    return x.requires_grad_(requires_grad)


def watch_gathers_and_releases(model, on_gather, on_release=None):
    """Calls ``on_gather(param)`` for each of ``model``'s ZeRO-3 parameters that a gather is about to
    fetch from its partitions, and ``on_release(param)`` for each one that a partition call has just
    freed.

    Wraps each parameter's gather entry points (the coordinator's coalesced gather and the
    synchronous one) and its ``partition``, so every gather and release is seen whatever triggers it.
    """

    def wrap_gather(param, name):
        original = getattr(param, name)

        def observed(*args, **kwargs):
            params = args[0] if name == "all_gather_coalesced" and args else [param]
            for p in params:
                if p.ds_status == ZeroParamStatus.NOT_AVAILABLE:
                    on_gather(p)
            return original(*args, **kwargs)

        setattr(param, name, observed)

    def wrap_partition(param):
        original = param.partition

        def observed(*args, **kwargs):
            params = kwargs.get("param_list") or (args[0] if args else None) or [param]
            available = [p for p in params if p.ds_status == ZeroParamStatus.AVAILABLE]
            result = original(*args, **kwargs)
            for p in available:
                if p.ds_status == ZeroParamStatus.NOT_AVAILABLE:
                    on_release(p)
            return result

        param.partition = observed

    for param in model.parameters():
        wrap_gather(param, "all_gather_coalesced")
        wrap_gather(param, "all_gather")
        if on_release is not None:
            wrap_partition(param)


def count_all_gathers(model):
    """Counts the bytes all-gathered for ``model``'s ZeRO-3 parameters, frozen and trainable apart.
    Returns the dict it keeps up to date."""
    counts = {"frozen": 0, "trainable": 0}

    def count(param):
        counts["trainable" if param.requires_grad else "frozen"] += param.ds_numel * param.ds_tensor.element_size()

    watch_gathers_and_releases(model, count)
    return counts


def record_lifecycle_trace(model):
    """Records every gather and release of ``model``'s ZeRO-3 parameters, in order, as lines
    "<micro-batch> <phase> <gather|release> <parameter> <gathered numel after it>", phase being
    forward, backward or step (the optimizer's). Returns the list it appends to."""
    names = {id(p): name for name, p in model.named_parameters()}
    trace = []
    state = {"micro_batch": -1, "phase": "setup", "gathered": 0}

    def start_forward(module, args):
        state["micro_batch"] += 1
        state["phase"] = "forward"

    def record(event, param, numel_change):
        if torch._C._current_graph_task_id() != -1:
            state["phase"] = "backward"
        elif state["phase"] == "backward":
            state["phase"] = "step"
        state["gathered"] += numel_change
        trace.append(f"{state['micro_batch']} {state['phase']} {event} {names[id(param)]} {state['gathered']}")

    # runs before the engine's own pre-forward hook, which gathers the first parameters
    model.register_forward_pre_hook(start_forward, prepend=True)
    watch_gathers_and_releases(model, lambda p: record("gather", p, p.ds_numel),
                               lambda p: record("release", p, -p.ds_numel))
    return trace


def reference_grads(reference):
    return {name: p.grad.detach().clone() for name, p in reference.named_parameters() if p.grad is not None}


def assert_grads_match(engine, reference_grads_by_name, *, exact, when="", subnormal_slack=False, reordered=False):
    """Compares ZeRO-3's full gradients with the reference's (after the last micro-batch).

    With ``exact`` and ``subnormal_slack``, elements that differ by less than the smallest normal
    float count as equal: the rounding of ZeRO's pre-divided data-parallel average, which only
    values that small show (tests/scenarios/gradcompare.py). With ``reordered`` too, elements may
    also differ by the rounding of a sum taken in another order (relative 1e-6, absolute 1e-7)."""
    # fp16 gradients stay multiplied by the loss scale until the optimizer step unscales them
    loss_scale = engine.optimizer.loss_scale
    checked = 0
    for name, param in engine.module.named_parameters():
        if not param.requires_grad:
            continue
        grad = full_grad(param) / loss_scale
        expected = reference_grads_by_name.get(name)
        assert grad is not None, f"{name}: ZeRO-3 produced no gradient"
        assert expected is not None, f"{name}: the reference produced no gradient"
        grad = grad.float().cpu()
        expected = expected.float().cpu()
        if exact and reordered:
            torch.testing.assert_close(grad, expected, rtol=1e-6, atol=1e-7, msg=lambda m: f"{name} {when}: {m}")
        elif exact and subnormal_slack:
            assert gradcompare.equal_up_to_subnormal(grad, expected), (
                f"{name}: gradient differs from the reference {when} by more than the smallest normal float "
                f"({int(gradcompare.mismatched(grad, expected).sum())} element(s)), max abs diff "
                f"{(grad - expected).abs().max().item():.3e}")
        elif exact:
            assert torch.equal(grad, expected), (f"{name}: gradient differs from the reference {when}, max abs diff "
                                                 f"{(grad - expected).abs().max().item():.3e}")
        else:
            torch.testing.assert_close(grad, expected, rtol=5e-2, atol=5e-3, msg=lambda m: f"{name} {when}: {m}")
        checked += 1
    assert checked, "no trainable parameter was checked"
    return checked


def discard_aborted_backward(engine):
    """Drops the gradients an aborted backward left queued in ZeRO-3's optimizer.

    Recovering the optimizer after an exception in backward is DeepSpeed #8245, not this series
    (which covers the parameter lifecycle); the fault scenarios do it by hand so that they can
    check that the next step's gradients are exact.
    """
    for bucket in engine.optimizer.ipg_buckets.values():
        if hasattr(bucket, "clear_params"):
            bucket.clear_params()
        else:
            # v0.17.x buckets have no clear_params(); their reduction resets a bucket this way,
            # keeping the buffer allocated at init (their clear() would drop it for good). The
            # series' port also empties the slots map there (patch 0014): a ds_id left in it makes
            # the next backward take that param's gradient for a second one and never bucket it.
            bucket.params.clear()
            if hasattr(bucket, "slots"):
                bucket.slots.clear()
            bucket.elements = 0
    # set_to_none=True calls record_stream, which CPU tensors do not support
    engine.optimizer.zero_grad(set_to_none=False)


def gather_partitions(local, param):
    """The full tensor of a ZeRO-3 parameter from every rank's ``local`` partition.

    The tests read parameters and gradients this way, into separate buffers, instead of through
    DeepSpeed's GatheredParameters / safe_get_full_grad: those all-gather in place (the input is a
    slice of the output), which NCCL defines and gloo does not. On CPU they now and then return
    uninitialised memory, on a pristine v0.19.2 tree and with no frozen parameter too.
    """
    # With parameter offload the partition lives in host memory, which NCCL cannot gather from:
    # gather on the accelerator the process group uses, and return the result there.
    local = local.to(get_accelerator().current_device_name()).contiguous()
    parts = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, local)
    return torch.cat(parts)[:param.ds_numel].view(param.ds_shape)


def full_grad(param):
    return gather_partitions(safe_get_local_grad(param), param)


def sync_reference(engine, reference):
    """Copies ZeRO-3's parameters into the reference after an optimizer step.

    Two Adam implementations round differently, so without this the second step's gradients
    would differ by the optimizers, which are not under test; with it, every step's gradients are
    compared exactly.
    """
    params = dict(engine.module.named_parameters())
    with torch.no_grad():
        for name, ref_param in reference.named_parameters():
            ref_param.copy_(gather_partitions(params[name].ds_tensor.data, params[name]).to(ref_param.dtype))


def _model_output(model, *inputs):
    return model(*inputs)


def train(engine,
          reference,
          make_inputs,
          *,
          steps=2,
          gas=1,
          exact=True,
          after_backward=None,
          after_forward=None,
          counter=True,
          unused_params=(),
          quiescent_after_backward=True,
          loss_of=None):
    """Trains ZeRO-3 and the reference side by side on identical micro-batches.

    Checks after every backward: quiescence (I1), and with ``counter`` a non-negative available-
    parameter counter (I7); after the last micro-batch of each step: the gradients, against the
    reference's. ``unused_params`` names trainable parameters the forward does not use: the
    reference has no gradient for them, ZeRO-3 must have zeros. Without
    ``quiescent_after_backward`` quiescence is checked after the optimizer step only.
    ``loss_of(model, *inputs)`` computes either model's loss where more than its forward goes into
    it (a backward of its own first, say); by default the loss is the model's output. Returns the
    losses of both.
    """
    if loss_of is None:
        loss_of = _model_output
    losses, reference_losses = [], []
    for step in range(steps):
        reference.zero_grad()
        for micro in range(gas):
            inputs = make_inputs(step * gas + micro)
            loss = loss_of(engine, *inputs)
            if after_forward is not None:
                after_forward(engine)
            engine.backward(loss)
            if quiescent_after_backward:
                assert_quiescent(engine, f"after backward of step {step}, micro-batch {micro}", counter)
            if after_backward is not None:
                after_backward(engine)

            ref_inputs = [
                t.detach().clone().requires_grad_(t.requires_grad) if t.is_floating_point() else t for t in inputs
            ]
            ref_loss = loss_of(reference, *ref_inputs)
            (ref_loss / gas).backward()
            losses.append(loss.item())
            reference_losses.append(ref_loss.item())
            if micro == gas - 1:
                expected = reference_grads(reference)
                for name in unused_params:
                    assert name not in expected, f"{name} is used: the reference has a gradient for it"
                    expected[name] = torch.zeros_like(dict(reference.named_parameters())[name])
                assert_grads_match(engine, expected, exact=exact, when=f"in step {step}")
            # DeepSpeed steps after every micro-batch and updates only at the accumulation boundary
            engine.step()
        sync_reference(engine, reference)
        assert_quiescent(engine, f"after optimizer step {step}", counter)
    return {"losses": losses, "reference_losses": reference_losses}
