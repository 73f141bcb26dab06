"""The checkpoint recompute's early stop inside, or right after, a module that has only frozen
parameters (issue 13, finding 8); and a recompute without early stop.

What the pre-backward of one invocation of a module does (gather for its backward and run its
post-backward through its inputs; gather and run it at the end of the graph task, the inputs
needing no grad; gather nothing, the outputs being leaves) is a fact about that invocation. A
module attribute set by the post-forward hook and reset by the pre-forward hook would hold it
for the module instead: a recompute re-runs the pre-forward hook, and when torch's early stop
(``set_checkpoint_early_stop(True)``, the default) ends the recompute inside the module's forward,
the post-forward hook never runs again, so the original invocation's pre-backward, which runs
after the recompute, would read the reset value, for good. These scenarios put that shape under
ZeRO-3 and check every step: quiescence after each backward (every invocation got its
post-backward), exact gradients, and that the recompute really stopped where the case says.
"""

import functools

import torch
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

from tests.scenarios.zero3 import batch, build, lifecycle_config, train

DIM = 8
# DeepSpeed's default persistence threshold (1e5) keeps every parameter of a DIM-8 model gathered;
# at 320 the frozen weight (102400 numel) and the Linear weight are released, the norms persist
DEFAULTS_DIM = 320

# how the frozen-only module of each block gets the tensor whose grad its output carries
FEEDS = {
    "input": "positionally, an input that requires grad (post-backward armed through it)",
    "attribute": "through an attribute, with an input that needs no grad (post-backward at the end "
                 "of the graph task)",
    "leaf": "not at all: its output is made a leaf that requires grad by a forward hook (no backward)",
    "mixed": "twice: first through an attribute, then through its input",
}
# (mixed in the other order, stopped inside the second invocation, fails in plain torch already:
# "Trying to backward through the graph a second time", from the second block's recompute)
# where the recompute's early stop falls: "inside" the frozen-only module (its forward saves the
# block's last saved tensor), or "after" it (a relu at the end of the block saves its output)
WHERE = ("inside", "after")


class FrozenMatmul(torch.nn.Module):
    """Only a frozen weight, read directly in forward: ``x @ W`` saves W itself (x requires grad,
    W does not), so when this is the block's last saving op the recompute stops inside it."""

    def __init__(self, dim):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(dim, dim) / dim**0.5, requires_grad=False)
        self.stash = None  # a tensor that requires grad, handed over outside the hooks' sight

    def forward(self, x):
        if self.stash is not None:
            x = x + self.stash  # x itself needs no grad: nothing arms post-backward through it
        return x @ self.weight


def _output_becomes_leaf(module, args, output):
    # transformers' enable_input_require_grads() pattern
    output.requires_grad_(True)


class EarlyStopBlock(torch.nn.Module):
    """A frozen norm (whose recompute release is v0.19.2's CheckpointError), a trainable Linear,
    then the frozen-only module fed as ``feed`` says, then a relu if ``where`` is "after"."""

    def __init__(self, dim, feed, where):
        super().__init__()
        if feed not in FEEDS or where not in WHERE:
            raise ValueError(f"feed={feed!r}, where={where!r}: expected one of {sorted(FEEDS)} and of {WHERE}")
        if feed == "leaf" and where == "inside":
            raise ValueError("a module whose inputs need no grad and whose output is a leaf saves nothing: the "
                             "recompute cannot stop inside it")
        self.norm = torch.nn.LayerNorm(dim)
        self.norm.requires_grad_(False)
        self.lin = torch.nn.Linear(dim, dim)
        # a matrix, not a norm: under DeepSpeed's defaults a norm would be persistent, and a
        # persistent parameter left gathered goes unnoticed
        self.frozen = FrozenMatmul(dim)
        if feed == "leaf":
            self.frozen.register_forward_hook(_output_becomes_leaf)
        self.feed = feed
        self.where = where

    def forward(self, x):
        h = self.lin(self.norm(x))
        if self.feed == "input":
            y = self.frozen(h)
        elif self.feed == "attribute":
            self.frozen.stash = h
            y = self.frozen(torch.zeros_like(h).detach())
            self.frozen.stash = None
        elif self.feed == "leaf":
            # the multiply saves the leaf, after the frozen module's forward has returned
            y = h * self.frozen(torch.ones_like(h).detach())
        else:  # mixed: one invocation through the attribute, then one armed through its input
            self.frozen.stash = h
            y = self.frozen(torch.zeros_like(h).detach())
            self.frozen.stash = None
            y = self.frozen(y)
        return torch.relu(y) if self.where == "after" else y


class CheckpointedStack(torch.nn.Module):
    """Blocks checkpointed at module level (non-reentrant, early stop as ``early_stop`` says), then
    a trainable head."""

    def __init__(self, blocks, dim, early_stop):
        super().__init__()
        self.blocks = torch.nn.ModuleList(blocks)
        self.head = torch.nn.Linear(dim, 2)
        self.early_stop = early_stop

    def forward(self, x):
        with set_checkpoint_early_stop(self.early_stop):
            for block in self.blocks:
                x = checkpoint(block, x, use_reentrant=False)
        return self.head(x).pow(2).mean()


class EarlyStopStack(CheckpointedStack):
    """EarlyStopBlocks, early stop on."""

    def __init__(self, dim, depth, feed, where):
        super().__init__([EarlyStopBlock(dim, feed, where) for _ in range(depth)], dim, early_stop=True)


def _count_recompute_entries_and_exits(model):
    """Counts the forwards of the frozen-only modules that a recompute entered and those it
    finished. The hooks are registered after ZeRO-3's: "entered" means that ZeRO-3's pre-forward
    ran (and gathered), "finished" that its post-forward and pre-backward hooks ran too."""
    counts = {"entered": 0, "finished": 0}

    def in_recompute():
        return torch._C._current_graph_task_id() != -1

    def entered(module, args):
        counts["entered"] += in_recompute()

    def finished(module, args, output):
        counts["finished"] += in_recompute()

    for block in model.blocks:
        block.frozen.register_forward_pre_hook(entered)
        block.frozen.register_forward_hook(finished)
    return counts


def early_stop_in_frozen_only_module(*, feed="attribute", where="inside", defaults=False, steps=3, depth=2):
    """Blocks norm (frozen) -> Linear -> a frozen-only module (``FEEDS[feed]``), each checkpointed
    with early stop, the recompute stopping ``where`` the frozen-only module. Every backward must
    leave everything released (each invocation's post-backward ran, none came late), gradients
    equal the reference's exactly, for ``steps`` steps, under the lifecycle settings or DeepSpeed's
    defaults. v0.19.2: CheckpointError (the norm); without 0007 the frozen-only module fed no
    input that needs grad stays gathered after backward."""
    dim = DEFAULTS_DIM if defaults else DIM
    config = lifecycle_config(defaults=defaults)
    engine, reference = build(functools.partial(EarlyStopStack, dim, depth, feed, where), config)
    counts = _count_recompute_entries_and_exits(engine.module)
    try:
        result = train(engine,
                       reference,
                       lambda step: (batch(step, (2, dim), device=engine.device), ),
                       steps=steps)
    finally:
        engine.destroy()
    invocations = steps * depth * (2 if feed == "mixed" else 1)
    # the recompute must have stopped where this case says, or it tests something else
    expected_finished = invocations if where == "after" else invocations - steps * depth
    assert counts == {"entered": invocations, "finished": expected_finished}, (
        f"recomputes of the frozen-only modules: {counts}, expected {invocations} entered and "
        f"{expected_finished} finished (early stop {where} the module)")
    result["recompute"] = counts
    return result


class LinearLastBlock(torch.nn.Module):
    """A norm, then a Linear whose output is the block's. Under module-level checkpointing the first
    saved tensor that backward unpacks is the Linear's, so the recompute starts inside the Linear's
    backward, after its pre-backward gathered its weight; without early stop it runs on through
    the Linear's post-forward."""

    def __init__(self, dim, frozen_norm):
        super().__init__()
        self.norm = torch.nn.LayerNorm(dim)
        self.norm.requires_grad_(not frozen_norm)
        self.lin = torch.nn.Linear(dim, dim)

    def forward(self, x):
        return self.lin(self.norm(x))


class NoEarlyStopStack(CheckpointedStack):
    """LinearLastBlocks, early stop off."""

    def __init__(self, dim, depth, frozen_norm):
        super().__init__([LinearLastBlock(dim, frozen_norm) for _ in range(depth)], dim, early_stop=False)


def recompute_without_early_stop(*, frozen_norm=True, defaults=False, steps=3, depth=2):
    """Blocks norm -> Linear, checkpointed without early stop: each recompute runs the Linear's
    post-forward inside the Linear's own backward. Its trainable weight must stay gathered until
    the Linear's post-backward (its gradient is accumulated after the recompute), and every
    backward must leave everything released, with gradients exactly the reference's. v0.19.2:
    CheckpointError with a frozen norm; a fully trainable model and the series up to 0008 fail in
    the weight's AccumulateGrad (RuntimeError: a gradient of shape [8, 8] for a parameter of shape
    [0])."""
    dim = DEFAULTS_DIM if defaults else DIM
    engine, reference = build(functools.partial(NoEarlyStopStack, dim, depth, frozen_norm),
                              lifecycle_config(defaults=defaults))
    finished = [0]

    def linear_finished_in_recompute(module, args, output):
        finished[0] += torch._C._current_graph_task_id() != -1

    for block in engine.module.blocks:
        block.lin.register_forward_hook(linear_finished_in_recompute)
    try:
        result = train(engine,
                       reference,
                       lambda step: (batch(step, (2, dim), device=engine.device), ),
                       steps=steps)
    finally:
        engine.destroy()
    # without early stop every recompute runs the Linear to its end, or this tests something else
    assert finished[0] == steps * depth, (
        f"{finished[0]} recomputes ran a Linear's post-forward, expected {steps * depth}")
    return result


class FrozenWeightTrainableBias(torch.nn.Module):
    """A Linear with a frozen weight and a trainable bias (BitFit), checkpointed in a function that
    goes on past it (a relu saves its output), early stop on: the recompute runs the Linear's
    post-forward before the Linear's backward starts."""

    def __init__(self, dim):
        super().__init__()
        self.lin = torch.nn.Linear(dim, dim)
        self.lin.weight.requires_grad_(False)
        self.head = torch.nn.Linear(dim, 2)

    def forward(self, x):
        with set_checkpoint_early_stop(True):
            h = checkpoint(lambda t: torch.relu(self.lin(t)), x, use_reentrant=False)
        return self.head(h).pow(2).mean()


def trainable_bias_released_by_early_stopped_recompute(*, steps=2):
    """The recompute of a module whose backward has not started releases its trainable params at
    its post-forward, as without the series: only a recompute inside the module's own backward
    keeps them (0009, PR 8). Observed from a hook that runs right after ZeRO-3's post-forward, in
    every recompute; plus the usual quiescence and exact gradients."""
    engine, reference = build(functools.partial(FrozenWeightTrainableBias, DIM), lifecycle_config())
    seen = []

    def after_post_forward(module, args, output):
        if torch._C._current_graph_task_id() != -1:
            seen.append(module.bias.ds_status.name)

    engine.module.lin.register_forward_hook(after_post_forward)
    try:
        result = train(engine,
                       reference,
                       lambda step: (batch(step, (2, DIM), device=engine.device, requires_grad=True), ),
                       steps=steps)
    finally:
        engine.destroy()
    assert seen == ["NOT_AVAILABLE"] * steps, (
        f"the bias after each recompute's post-forward: {seen}, expected it partitioned every time")
    return result
