"""Measurements, not assertions: what a DeepSpeed tree leaves behind in the scenarios the series
fixes. scripts/cpu_bookkeeping.py runs ``measure`` against several trees (v0.19.2, the minimal
coordinator skip of DeepSpeed PR #8130 emulated on v0.19.2, upstream 0.19.3, the series) and
tabulates the results for the RFC's Alternatives section.
"""

import functools

import torch

import deepspeed
from deepspeed.runtime.zero import parameter_offload
from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus
from deepspeed.runtime.zero.partitioned_param_coordinator import PartitionedParameterCoordinator

from tests.scenarios import models
from tests.scenarios.zero3 import available_numel_counter, batch, frozen_available, lifecycle_config

DIM = 8


def emulate_minimal_skip():
    """PR #8130 in words: a forward release inside a backward graph task does not partition frozen
    parameters. Its skip sits after the active-module discard, so emulating it at the partition
    step (__release_param) is faithful."""
    release_sub_module = PartitionedParameterCoordinator.release_sub_module
    release_param = PartitionedParameterCoordinator._PartitionedParameterCoordinator__release_param
    in_forward_release = [False]

    def release_sub_module_marked(self, submodule, forward=False, **kwargs):
        in_forward_release[0] = forward
        try:
            return release_sub_module(self, submodule, forward=forward, **kwargs)
        finally:
            in_forward_release[0] = False

    def release_param_skipping(self, param, *args, **kwargs):
        if in_forward_release[0] and torch._C._current_graph_task_id() != -1 and not param.requires_grad:
            return
        return release_param(self, param, *args, **kwargs)

    PartitionedParameterCoordinator.release_sub_module = release_sub_module_marked
    PartitionedParameterCoordinator._PartitionedParameterCoordinator__release_param = release_param_skipping


def _engine(model, gas=1):
    engine, *_ = deepspeed.initialize(model=model,
                                      model_parameters=[p for p in model.parameters() if p.requires_grad],
                                      config=lifecycle_config(gas=gas))
    return engine


def _outcome(fn):
    try:
        return fn()
    except Exception as error:  # the measurement is which error, if any
        return f"{type(error).__name__}"


def _crash():
    engine = _engine(models.frozen_norm_stack(DIM, 2, "module"))
    for step in range(2):
        engine.backward(engine(batch(step, (2, DIM), device=engine.device)))
        engine.step()
    engine.destroy()
    return "trains"


def _no_grad_input():
    """Gathered params after the first micro-batch's backward, and the counter after the step."""
    engine = _engine(models.scaled_stack(DIM, 2, "module"), gas=2)
    gathered = None
    for micro in range(2):
        engine.backward(engine(batch(micro, (2, DIM), device=engine.device, requires_grad=False)))
        if micro == 0:
            gathered = sum(p.ds_status != ZeroParamStatus.NOT_AVAILABLE and not p.ds_persist
                           for p in engine.module.parameters())
        engine.step()
    counter = available_numel_counter(engine)
    engine.destroy()
    return {"gathered_after_backward": gathered, "counter_after_step": counter}


def _reentrant_detached():

    engine = _engine(models.detaching_stack(DIM, 2, "reentrant"))
    engine.backward(engine(batch(0, (2, DIM), device=engine.device)))
    left = len(frozen_available(engine))
    engine.step()
    engine.destroy()
    return left


def _frozen_peak(checkpointing, depth=4):
    model = models.frozen_norm_stack(DIM, depth, checkpointing, True)
    engine = _engine(model)
    peak = [0]

    def observe():
        peak[0] = max(peak[0], len(frozen_available(engine)))

    for block in engine.module.blocks:
        block.observer = observe
        block.inner_observer = observe
    engine.backward(engine(batch(0, (2, DIM), device=engine.device)))
    engine.step()
    engine.destroy()
    return f"{peak[0]}/{2 * depth}"


def _stack_growth(steps=3):
    engine = _engine(models.trainable_stack(DIM, 3, "module"))
    own = set(id(m) for m in engine.module.modules())
    lengths = []
    for step in range(steps):
        engine.backward(engine(batch(step, (2, DIM), device=engine.device)))
        engine.step()
        lengths.append(sum(id(m) in own for m in parameter_offload.FWD_MODULE_STACK))
    engine.destroy()
    return " → ".join(map(str, lengths))


def _after_failed_backward():
    """Frozen params still gathered when the next forward's first module runs."""
    engine = _engine(models.Stack([models.FailInBackwardBlock(DIM) for _ in range(2)], DIM, "module"))
    engine.module.blocks[0].armed[0] = True
    try:
        engine.backward(engine(batch(0, (2, DIM), device=engine.device)))
    except RuntimeError:
        pass
    engine.module.blocks[0].armed[0] = False
    seen = []
    hook = engine.module.blocks[0].register_forward_pre_hook(lambda *_: seen.append(len(frozen_available(engine))))
    try:
        engine(batch(1, (2, DIM), device=engine.device))
    finally:
        hook.remove()
    engine.destroy()
    return seen[0]


def measure(*, minimal_skip=False):
    if minimal_skip:
        emulate_minimal_skip()
    return {
        "version": deepspeed.__version__,
        "frozen norm, non-reentrant": _outcome(_crash),
        "no-grad block input": _outcome(_no_grad_input),
        "reentrant, frozen norm fed a detached tensor: frozen params left gathered": _outcome(_reentrant_detached),
        "frozen peak in backward, module checkpoint": _outcome(functools.partial(_frozen_peak, "module")),
        "frozen peak in backward, function checkpoint": _outcome(functools.partial(_frozen_peak, "function")),
        "frozen peak in backward, reentrant": _outcome(functools.partial(_frozen_peak, "reentrant")),
        "FWD_MODULE_STACK entries after steps 1, 2, 3": _outcome(_stack_growth),
        "frozen params gathered at the next forward after a failed backward": _outcome(_after_failed_backward),
    }
