"""Randomly drawn models under ZeRO-3, checked against a plain torch reference (the rank side of
tests/lifecycle_fuzz.py, which draws the cases).

A case is plain data (dicts, lists, strings, ints), so that hypothesis can shrink it and a failing
one can be pasted into a test as a literal. ``run_case`` builds the same model on every rank from
it, trains it under ZeRO-3 and a reference copy side by side, and raises ``Violation`` tagged with
the invariant that broke (see ``TAGS``). It checks invariants of whatever DeepSpeed is installed:
nothing here knows which release or patch series it runs on.

The case format::

    {"dim": 4,
     "model": NODE,                      # the drawn module tree, 1 to 4 levels
     "inputs": {"x_grad": bool,          # the model input requires grad
                "aux": "none" | "positional" | "keyword",   # a second input, and how it is passed
                "aux_grad": bool},
     "forwards": 1..3,                   # forwards summed into one loss before one backward
     "early_stop": bool,                 # torch.utils.checkpoint.set_checkpoint_early_stop
     "zero": {"gas": 1..3, "prefetch": "0" | "default", "reuse": "0" | "default",
              "persistence": "0" | "vectors" | "default",
              "bucket": "default" | "one-param"},   # reduce_bucket_size; optional, default if absent
     "steps": int}                       # optimizer steps

    NODE = {"params": {"w": P, "s": P},  # a dim x dim matrix and a dim vector; P: "none" |
                                         # "trainable" | "frozen"
            "children": [NODE, ...],
            "ops": [OP, ...],            # applied in order to the running tensor h
            "output": "tensor" | "tuple" | "dict" | "param" | "leaf",
            "z3_leaf": bool}

    OP = ["linear"]                      # h = F.linear(h, self.w): a parameter used directly in forward
       | ["scale"]                       # h = h * self.s
       | ["act", "tanh" | "relu" | "sin"]
       | ["child", i, CKPT, calls, AUX]  # h = child i applied ``calls`` times, each under CKPT; AUX
                                         # ("none" | "positional" | "keyword") passes this node's aux
       | ["nograd", i]                   # under torch.no_grad: h = h + child i (h)
       | ["external", k]                 # h = h * the k-th (mod count) vector of another module,
                                         # registered with deepspeed.zero.register_external_parameter
    CKPT = "none" | "module" | "function" | "function-relu" | "reentrant"   # see models.run_checkpointed
         | "forward"                     # no checkpointing, the child's forward called as a plain
                                         # function: "function" without checkpointing (never drawn)

Outputs: "tuple" returns (h, sin h), "dict" {"a": h, "b": cos h}, "param" (h, self.s) (the module's
own parameter, which ZeRO-3 registers as external to the caller), "leaf" h computed from the
detached input and made to require grad by a forward hook (transformers'
enable_input_require_grads()). The caller multiplies the two tensors of a tuple and adds those of a
dict.
"""

import copy
import functools

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

import deepspeed
from deepspeed.utils import set_z3_leaf_module

from tests.scenarios import models
from tests.scenarios.fuzz_case import may_run_a_module_twice, nodes, returns_a_parameter_through_a_reentrant_checkpoint
from tests.scenarios.zero3 import (assert_forward_stack_clean, assert_grads_match, available_numel_counter, batch,
                                   build, count_all_gathers, lifecycle_config, lifecycle_violations, sync_reference)

# What each tag means; the parent reports failures by tag.
TAGS = {
    "error": "ZeRO-3 raised where the reference does not",
    "grad": "gradients differ from the reference's (fp32, compared exactly down to the smallest normal float: "
            "tests/scenarios/gradcompare.py)",
    "I1": "after backward or the optimizer step, a parameter is still gathered, still claimed by a module "
          "(ds_active_sub_modules), or a deferred release or post-backward trigger is outstanding",
    "I4": "a deferred release was carried out late (by a drain instead of its owner's post-backward)",
    "I7": "the available-parameter counter is negative",
    "I8": "FWD_MODULE_STACK holds stale entries after a root forward",
    "I10": "frozen all-gather volume per step exceeds that of the same case without checkpointing (or differs "
           "from it, where the RFC promises equality)",
}


class Violation(AssertionError):
    """An invariant broke; ``str()`` starts with "[TAG]"."""

    def __init__(self, tag, message):
        assert tag in TAGS, tag
        self.tag = tag
        super().__init__(f"[{tag}] {message}")


# ----- the model ------------------------------------------------------------------------------------


def _combine(output):
    """One tensor from a module's output, whatever its kind."""
    if isinstance(output, dict):
        return output["a"] + output["b"]
    if isinstance(output, tuple):
        return output[0] * output[1]
    return output


def _make_output_require_grad(module, inputs, output):
    # transformers' enable_input_require_grads(): the hook it puts on the input embeddings
    output.requires_grad_(True)


class FuzzNode(torch.nn.Module):

    def __init__(self, spec, dim):
        super().__init__()
        self.spec = spec
        params = spec["params"]
        if params["w"] != "none":
            self.w = torch.nn.Parameter(torch.randn(dim, dim) / dim**0.5, requires_grad=params["w"] == "trainable")
        if params["s"] != "none":
            self.s = torch.nn.Parameter(torch.rand(dim) + 0.5, requires_grad=params["s"] == "trainable")
        self.kids = torch.nn.ModuleList(FuzzNode(child, dim) for child in spec["children"])
        self.externals = []  # filled by FuzzModel once the whole tree exists
        if spec["output"] == "leaf":
            self.register_forward_hook(_make_output_require_grad)
        if spec.get("z3_leaf"):
            set_z3_leaf_module(self, True)

    def _call_child(self, index, aux, how):
        kid = self.kids[index % len(self.kids)]
        args, kwargs = [], {}
        if aux is not None and how == "positional":
            args.append(aux)
        elif aux is not None and how == "keyword":
            kwargs["aux"] = aux
        return kid, args, kwargs

    def forward(self, x, aux=None):
        h = x.detach() if self.spec["output"] == "leaf" else x
        if aux is not None:
            h = h + aux
        for op in self.spec["ops"]:
            kind = op[0]
            if kind == "linear" and hasattr(self, "w"):
                h = F.linear(h, self.w)
            elif kind == "scale" and hasattr(self, "s"):
                h = h * self.s
            elif kind == "act":
                h = {"tanh": torch.tanh, "relu": torch.relu, "sin": torch.sin}[op[1]](h)
            elif kind == "child" and self.kids:
                _, index, ckpt, calls, how = op
                kid, args, kwargs = self._call_child(index, aux, how)
                for _ in range(calls):
                    h = _combine(_run(kid, ckpt, h, *args, **kwargs))
            elif kind == "nograd" and self.kids:
                kid = self.kids[op[1] % len(self.kids)]
                with torch.no_grad():
                    y = _combine(kid(h))
                h = h + y
            elif kind == "external" and self.externals:
                h = h * self.externals[op[1] % len(self.externals)].s
        output = self.spec["output"]
        if output == "tuple":
            return h, torch.sin(h)
        if output == "dict":
            return {"a": h, "b": torch.cos(h)}
        if output == "param" and hasattr(self, "s"):
            return h, self.s
        return h


def _run(kid, ckpt, h, *args, **kwargs):
    if ckpt == "forward":
        return kid.forward(h, *args, **kwargs)
    if ckpt == "function-relu":
        # the callable goes on past the module with an op that saves its output, so the recompute
        # runs the module's post-forward (a relu on the module's own output would not accept a tuple)
        return checkpoint(lambda *a, **k: torch.relu(_combine(kid(*a, **k))), h, *args, use_reentrant=False, **kwargs)
    return models.run_checkpointed(kid, ckpt, h, *args, **kwargs)


class FuzzModel(torch.nn.Module):
    """The drawn tree under a trainable head, returning the loss (so every case has a trainable
    parameter and a scalar to call backward on)."""

    def __init__(self, case):
        super().__init__()
        dim = case["dim"]
        self.root = FuzzNode(case["model"], dim)
        self.head = torch.nn.Parameter(torch.randn(dim))
        nodes = [m for m in self.root.modules() if isinstance(m, FuzzNode)]
        for node in nodes:
            # the owners, in a plain list (not registered as submodules); forward reads owner.s, an
            # attribute access as real code makes it, which ZeRO-3 also intercepts (ZeROOrderedDict)
            node.externals = [other for other in nodes if other is not node and hasattr(other, "s")]
            for op in node.spec["ops"]:
                if op[0] == "external" and node.externals:
                    deepspeed.zero.register_external_parameter(node, node.externals[op[1] % len(node.externals)].s)

    def forward(self, x, aux=None):
        return (_combine(self.root(x, aux)) * self.head).pow(2).mean()


# ----- the run --------------------------------------------------------------------------------------


def zero_config(case):
    zero = case["zero"]
    overrides = {}
    if zero["prefetch"] == "0":
        overrides["stage3_prefetch_bucket_size"] = 0
    if zero["reuse"] == "0":
        overrides["stage3_max_reuse_distance"] = 0
    # DeepSpeed's default persistence threshold (1e5) keeps every parameter of these models gathered
    overrides["stage3_param_persistence_threshold"] = {"0": 0, "vectors": case["dim"], "default": 100000}[
        zero["persistence"]]
    if zero.get("bucket") == "one-param":
        # every gradient reduced on its own: a second gradient of a param meets its first already
        # partitioned, not in the bucket
        overrides["reduce_bucket_size"] = 1
    return lifecycle_config(gas=zero["gas"], defaults=True, **overrides)


def _calls(case):
    """Every checkpointing mode used anywhere in the tree, and whether a sub-region needs no grad."""
    modes, no_grad_regions, leaf_outputs = set(), False, False
    for node in nodes(case):
        leaf_outputs |= node["output"] == "leaf"
        for op in node["ops"]:
            if op[0] == "child" and node["children"]:
                modes.add(op[2])
            no_grad_regions |= op[0] == "nograd" and bool(node["children"])
    return modes, no_grad_regions, leaf_outputs


def volume_promised(case):
    """Whether invariant I10 (the RFC) promises this case at most the frozen all-gather volume of its
    run without checkpointing: non-reentrant checkpointing only, parameters not kept between uses
    (reuse distance 0), and every module's output requiring grad (so that every frozen parameter a
    recompute gathers has a backward that uses that gather). A frozen module fed a tensor that
    needs no grad (a no_grad region, a detached input, an input that needs no grad) has no backward:
    without checkpointing it is gathered once, with checkpointing its recompute gathers it again."""
    modes, no_grad_regions, leaf_outputs = _calls(case)
    return (bool(modes - {"none"}) and "reentrant" not in modes and case["zero"]["reuse"] == "0"
            and case["inputs"]["x_grad"] and not no_grad_regions and not leaf_outputs)


def volume_exact(case):
    """Whether I10 promises the very volume of the run without checkpointing, not just at most that.
    With prefetching on, or a module run twice, checkpointing may gather fewer frozen bytes: the hold
    keeps what a recompute gathered until the module's post-backward, where the run without
    checkpointing can release and gather again (measured: tests/test_lifecycle_fuzz.py,
    test_fuzz_volume_with_prefetching and test_fuzz_volume_module_run_twice)."""
    return case["zero"]["prefetch"] == "0" and not may_run_a_module_twice(case)


def without_checkpointing(case):
    """The same calls without checkpointing: checkpoint(kid.forward, h) becomes kid.forward(h), so
    that the child's module hooks stay out of both runs, and every other mode a module call (the
    relu of "function-relu" is left out: it has no parameters and runs no hooks)."""
    case = copy.deepcopy(case)
    for node in nodes(case):
        node["ops"] = [op[:2] + ["forward" if op[2] == "function" else "none"] + op[3:] if op[0] == "child" else op
                       for op in node["ops"]]
    return case


def _inputs(case, micro, device):
    spec = case["inputs"]
    x = batch(micro, (2, case["dim"]), device=device, requires_grad=spec["x_grad"])
    aux = None
    if spec["aux"] != "none":
        aux = batch(10000 + micro, (2, case["dim"]), device=device, requires_grad=spec["aux_grad"])
    return x, aux


def _loss(model, case, micro, device, after_forward=None):
    """The summed loss of ``case["forwards"]`` forwards, each on its own micro-batch."""
    total = 0
    with set_checkpoint_early_stop(case["early_stop"]):
        for f in range(case["forwards"]):
            x, aux = _inputs(case, 100 * micro + f, device)
            if aux is None:
                loss = model(x)
            elif case["inputs"]["aux"] == "keyword":
                loss = model(x, aux=aux)
            else:
                loss = model(x, aux)
            if after_forward is not None:
                after_forward()
            total = total + loss
    return total


def _reference_grads(reference):
    """The reference's gradients by name; a trainable parameter that got none has a zero gradient,
    which is what ZeRO-3 reports for it."""
    return {
        name: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().clone()
        for name, p in reference.named_parameters() if p.requires_grad
    }


def _check_state(engine, when):
    problems = lifecycle_violations(engine)
    negative = [p for p in problems if p.startswith("available-parameter counter is negative")]
    if negative:
        raise Violation("I7", f"{when}: {negative[0]}")
    if problems:
        raise Violation("I1", f"ZeRO-3 state is not quiescent {when}:\n  " + "\n  ".join(problems))


def _zero3_error(error, when):
    message = f"{type(error).__name__} {when}: {error}"
    if "only at the end of backward" in str(error):
        return Violation("I4", message)
    if "still outstanding at the optimizer step" in str(error):
        return Violation("I1", message)
    return Violation("error", message)


def _train(case, *, count_gathers=False):
    if returns_a_parameter_through_a_reentrant_checkpoint(case):
        # checked before the reference runs: its backward would recurse without end, not raise
        return {"invalid": "a parameter returned through a reentrant checkpoint recomputes that checkpoint "
                           "inside its own backward without end (torch's CheckpointFunction gives it a grad_fn)"}
    factory = functools.partial(FuzzModel, case)
    engine, reference = build(factory, zero_config(case))
    gathers = count_all_gathers(engine.module) if count_gathers else None
    gas = case["zero"]["gas"]
    per_step = []
    forwards = [0]

    def after_forward():
        forwards[0] += 1
        when = f"after root forward {forwards[0]}"
        try:
            assert_forward_stack_clean(engine, when)
        except AssertionError as error:
            raise Violation("I8", str(error)) from None
        counter = available_numel_counter(engine)
        if counter < 0:
            raise Violation("I7", f"{when}: available-parameter counter is negative: {counter}")

    # Reentrant checkpointing hands ZeRO-3 a gradient in parts, one per backward phase (each reentrant
    # region's nested backward, and the outer one), which it adds to the partition as its buckets are
    # reduced: with gradient accumulation, or a parameter reached by more than one phase (a module run
    # twice, two forwards), the order of that sum depends on when a bucket is reduced, which no
    # reference order matches in every case.
    reordered = "reentrant" in _calls(case)[0]
    try:
        for step in range(case["steps"]):
            reference.zero_grad()
            for micro in range(gas):
                index = step * gas + micro
                when = f"in step {step}, micro-batch {micro}"
                # the reference first: an error there means the drawn model is not valid torch
                try:
                    (_loss(reference, case, index, engine.device) / gas).backward()
                except Exception as error:  # any error: the case is rejected, not a finding
                    return {"invalid": f"the reference raised {type(error).__name__}: {error}"}
                overflowed = [
                    n for n, p in reference.named_parameters() if p.grad is not None and not p.grad.isfinite().all()
                ]
                if overflowed:
                    # drawn scales compound over nested repeated calls until fp32 overflows: inf or NaN
                    # gradients compare unequal to themselves, so such a case tells nothing
                    return {"invalid": f"the reference's gradients are not finite ({', '.join(overflowed)})"}
                try:
                    loss = _loss(engine, case, index, engine.device, after_forward)
                    engine.backward(loss)
                except Violation:
                    raise
                except Exception as error:  # which error it is is the finding
                    raise _zero3_error(error, when) from error
                _check_state(engine, f"after the backward {when}")
                if micro == gas - 1:
                    try:
                        # drawn models can drive gradients below the smallest normal float, where ZeRO's
                        # pre-divided average rounds (gradcompare); exact above it
                        assert_grads_match(engine,
                                           _reference_grads(reference),
                                           exact=True,
                                           subnormal_slack=True,
                                           reordered=reordered,
                                           when=f"in step {step}")
                    except AssertionError as error:
                        raise Violation("grad", str(error)) from None
                try:
                    engine.step()
                except Exception as error:
                    raise _zero3_error(error, f"at the optimizer step {when}") from error
            sync_reference(engine, reference)
            _check_state(engine, f"after optimizer step {step}")
            if gathers is not None:
                per_step.append(dict(gathers))
    finally:
        engine.destroy()
    return {"frozen_gathered": [s["frozen"] for s in per_step]}


def _per_step(totals):
    return [b - a for a, b in zip([0] + totals, totals)]


def run_case(*, case):
    """Trains ``case`` under ZeRO-3 and the reference; raises Violation, or returns what it
    checked ({"invalid": why} when the reference itself cannot run the case)."""
    promised = volume_promised(case)
    result = _train(case, count_gathers=promised)
    if "invalid" in result or not promised:
        return dict(result, volume_checked=False)
    plain = _train(without_checkpointing(case), count_gathers=True)
    ckpt_steps, plain_steps = _per_step(result["frozen_gathered"]), _per_step(plain["frozen_gathered"])
    exact = volume_exact(case)
    # step 0 records the trace (the existing volume test compares from step 1 on as well)
    for step in range(1, case["steps"]):
        if ckpt_steps[step] > plain_steps[step] or exact and ckpt_steps[step] != plain_steps[step]:
            raise Violation("I10", f"step {step}: {ckpt_steps[step]} bytes of frozen parameters all-gathered with "
                            f"checkpointing, {plain_steps[step]} without (per step: {ckpt_steps} vs {plain_steps}; "
                            f"{'equal' if exact else 'at most'} promised)")
    return dict(result, volume_checked=True)
