"""Small models that put frozen parameters where ZeRO-3 + activation checkpointing trips over them.

Every model takes ``checkpointing``: "none", "module" (non-reentrant, the checkpointed callable is
the block module), "function" (non-reentrant, the block's forward called as a plain function, so
that the block's own hooks do not run), "function-relu" (non-reentrant, a function that calls the
block and a relu after it), or "reentrant".
"""

import torch
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

CHECKPOINTING = ("none", "module", "function", "function-relu", "reentrant", "deepspeed", "deepspeed-non-reentrant")


def run_checkpointed(block, checkpointing, *args, **kwargs):
    """``block(*args, **kwargs)`` under ``checkpointing``; keyword arguments are torch's error
    with "reentrant", which does not take them."""
    if checkpointing == "none":
        return block(*args, **kwargs)
    if checkpointing == "module":
        return checkpoint(block, *args, use_reentrant=False, **kwargs)
    if checkpointing == "function":
        # the block's forward as a plain function: its own module hooks do not run, only those of
        # the modules it calls (what upstream 0.19.3 attributes to an outer module)
        return checkpoint(block.forward, *args, use_reentrant=False, **kwargs)
    if checkpointing == "function-relu":
        # the relu saves its output, so the recompute runs past the block: the block's post-forward
        # fires inside the recompute even when the block is a z3 leaf
        return checkpoint(lambda *a, **k: torch.relu(block(*a, **k)), *args, use_reentrant=False, **kwargs)
    if checkpointing == "reentrant":
        return checkpoint(block, *args, use_reentrant=True, **kwargs)
    if checkpointing in ("deepspeed", "deepspeed-non-reentrant"):
        # DeepSpeed's own activation checkpointing (Megatron-DeepSpeed's), configured by the caller
        import deepspeed
        function = (deepspeed.checkpointing.checkpoint
                    if checkpointing == "deepspeed" else deepspeed.checkpointing.non_reentrant_checkpoint)
        return function(block, *args, **kwargs)
    raise ValueError(f"unknown checkpointing mode {checkpointing!r}; expected one of {CHECKPOINTING}")


class Probe(torch.autograd.Function):
    """Identity whose backward calls ``observer``: it runs right after the backward of whatever
    consumed the probe's output, which makes parameter states observable mid-backward."""

    @staticmethod
    def forward(ctx, x, observer):
        ctx.observer = observer
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.observer()
        return grad, None


def probe(x, observer):
    return Probe.apply(x, observer) if observer is not None else x


class NormLinear(torch.nn.Module):
    """The seed reproducer's block: LayerNorm (frozen by the caller) -> Linear, optional relu tail
    (an op that saves its output, so the recompute runs to the end of the block)."""

    def __init__(self, dim, relu=False, bias=True):
        super().__init__()
        self.norm = torch.nn.LayerNorm(dim)
        self.lin = torch.nn.Linear(dim, dim, bias=bias)
        self.relu = relu
        self.observer = None  # called in backward right after the norm's backward
        self.inner_observer = None  # called in backward between the Linear's and the norm's backward

    def forward(self, x):
        x = self.norm(probe(x, self.observer))
        x = self.lin(probe(x, self.inner_observer))
        return torch.relu(x) if self.relu else x


class BlockWithoutBackward(torch.nn.Module):
    """A frozen NormLinear block that has no backward, called plainly or under no_grad (``leaf``),
    before a trainable head; returns the loss. (A trainable block under no_grad would get no
    gradient, which the reference comparison does not accept; the fuzzer's shrunk cases cover it.)"""

    def __init__(self, dim, leaf):
        super().__init__()
        if leaf not in ("frozen", "no_grad"):
            raise ValueError(f"leaf={leaf!r}: expected 'frozen' or 'no_grad'")
        self.block = NormLinear(dim)
        self.head = torch.nn.Linear(dim, dim)
        self.leaf = leaf
        self.block.requires_grad_(False)

    def forward(self, x):
        with torch.set_grad_enabled(torch.is_grad_enabled() and self.leaf != "no_grad"):
            x = self.block(x)
        return self.head(x).pow(2).mean()


class MappingOutputBlock(torch.nn.Module):
    """A NormLinear block returning its hidden state and a gate in a dict or a list (``output``), as
    an MoE block returns router logits or an encoder named outputs."""

    def __init__(self, dim, output):
        super().__init__()
        if output not in ("dict", "list"):
            raise ValueError(f"output={output!r}: expected 'dict' or 'list'")
        self.block = NormLinear(dim)
        self.output = output

    def forward(self, x):
        h = self.block(x)
        gate = torch.sigmoid(h)
        return {"hidden": h, "gate": gate} if self.output == "dict" else [h, gate]


class MappingOutputStack(torch.nn.Module):
    """Two MappingOutputBlocks (the caller makes them z3 leaves) and a trainable head; returns the loss."""

    def __init__(self, dim, output):
        super().__init__()
        self.blocks = torch.nn.ModuleList(MappingOutputBlock(dim, output) for _ in range(2))
        self.head = torch.nn.Linear(dim, dim)

    def forward(self, x):
        for block in self.blocks:
            out = block(x)
            h, gate = (out["hidden"], out["gate"]) if isinstance(out, dict) else out
            x = h * gate
        return self.head(x).pow(2).mean()


class ScaleOutput(torch.nn.Module):
    """Returns its input and its own trainable scale, which the caller applies (ZeRO-3 registers a
    returned parameter as an external parameter of the caller)."""

    def __init__(self, dim):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.rand(dim) + 0.5)

    def forward(self, x):
        return x, self.scale


class ScaledExpert(torch.nn.Module):
    """Returns its expert's output and its own trainable scale, which the caller applies (a
    layer-scale style module); its shift serves inputs it does not get here, so this forward leaves
    it unused."""

    def __init__(self, dim):
        super().__init__()
        self.expert = torch.nn.Linear(dim, dim)
        self.scale = torch.nn.Parameter(torch.rand(dim) + 0.5)
        self.shift = torch.nn.Parameter(torch.zeros(dim))

    def forward(self, x, shifted=False):
        h = self.expert(x)
        return (h + self.shift if shifted else h), self.scale


class ScaledExpertCaller(torch.nn.Module):
    """A ScaledExpert before a trainable head; returns the loss."""

    def __init__(self, dim):
        super().__init__()
        self.block = ScaledExpert(dim)
        self.head = torch.nn.Linear(dim, dim)

    def forward(self, x):
        h, scale = self.block(x)
        return self.head(h * scale).pow(2).mean()


class SharedLayerBlock(torch.nn.Module):
    """Applies one shared trainable Linear twice (a weight-tied recurrence): through its forward
    function under non-reentrant checkpointing (no hook of the layer runs, its weight becomes an
    external parameter of this block), then as a module under use_reentrant=True checkpointing,
    whose backward is nested in the outer one. Without the early stop (``early_stop=False``) the
    first checkpoint's recompute runs only once that nested backward is over."""

    def __init__(self, dim, early_stop):
        super().__init__()
        self.layer = torch.nn.Linear(dim, dim)
        self.early_stop = early_stop

    def forward(self, x):
        with set_checkpoint_early_stop(self.early_stop):
            h = torch.tanh(checkpoint(self.layer.forward, x, use_reentrant=False))
            return checkpoint(self.layer, h, use_reentrant=True)


class SharedLayerCaller(torch.nn.Module):
    """A SharedLayerBlock before a trainable head; returns the loss."""

    def __init__(self, dim, early_stop):
        super().__init__()
        self.block = SharedLayerBlock(dim, early_stop)
        self.head = torch.nn.Linear(dim, dim)

    def forward(self, x):
        return self.head(self.block(x)).pow(2).mean()


class ReturnedParamCaller(torch.nn.Module):
    """Calls a ScaleOutput through its forward function, under non-reentrant checkpointing
    (``checkpointing="function"``) or plainly ("none"), which runs none of its hooks, then as a
    module, before a trainable head; returns the loss."""

    def __init__(self, dim, checkpointing):
        super().__init__()
        if checkpointing not in ("function", "none"):
            raise ValueError(f"checkpointing={checkpointing!r}: expected 'function' or 'none'")
        self.inner = ScaleOutput(dim)
        self.head = torch.nn.Linear(dim, dim)
        self.checkpointing = checkpointing

    def forward(self, x):
        if self.checkpointing == "function":
            h, scale = checkpoint(self.inner.forward, x, use_reentrant=False)
        else:
            h, scale = self.inner.forward(x)
        h, scale = self.inner(h * scale)
        return self.head(h * scale).pow(2).mean()


class LoRALinear(torch.nn.Module):
    """A frozen base projection plus a trainable low-rank update, the shape PEFT gives LoRA."""

    def __init__(self, dim, rank=2):
        super().__init__()
        self.base = torch.nn.Linear(dim, dim)
        self.lora_a = torch.nn.Linear(dim, rank, bias=False)
        self.lora_b = torch.nn.Linear(rank, dim, bias=False)
        self.base.requires_grad_(False)

    def forward(self, x):
        return self.base(x) + self.lora_b(self.lora_a(x))


class LoRABlock(torch.nn.Module):

    def __init__(self, dim):
        super().__init__()
        self.norm = torch.nn.LayerNorm(dim)
        self.proj = LoRALinear(dim)
        self.norm.requires_grad_(False)

    def forward(self, x):
        return torch.relu(self.proj(self.norm(x)))


class ScaledLinear(torch.nn.Module):
    """A trainable projection followed by a frozen per-channel scale: fed an input that needs no
    grad, its output still needs grad, and the multiply saves the frozen scale itself."""

    def __init__(self, dim):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(dim, dim) / dim**0.5)
        self.scale = torch.nn.Parameter(torch.rand(dim) + 0.5, requires_grad=False)

    def forward(self, x):
        return (x @ self.weight.t()) * self.scale


class ScaledBlock(torch.nn.Module):

    def __init__(self, dim):
        super().__init__()
        self.scaled = ScaledLinear(dim)
        self.norm = torch.nn.LayerNorm(dim)
        self.lin = torch.nn.Linear(dim, dim)
        self.norm.requires_grad_(False)

    def forward(self, x):
        return self.lin(self.norm(self.scaled(x)))


class StashedWeightMatmul(torch.autograd.Function):
    """x @ (codes * scale).t() that keeps the frozen ``codes`` on ``ctx`` instead of saving them, as
    bitsandbytes' MatMul4Bit keeps its 4-bit weight (``ctx.tensors = (None, B)``), and saves only the
    frozen per-row scale. Backward reads a parameter that torch never saw being saved."""

    @staticmethod
    def forward(ctx, x, codes, scale):
        ctx.codes = codes
        ctx.save_for_backward(scale)
        return x @ (codes * scale.unsqueeze(1)).t()

    @staticmethod
    def backward(ctx, grad):
        (scale, ) = ctx.saved_tensors
        return grad @ (ctx.codes * scale.unsqueeze(1)), None, None


class QuantizedLoRALinear(torch.nn.Module):
    """QLoRA's shape without bitsandbytes: a frozen quantized base (integer codes stored in the
    compute dtype, as bnb_4bit_quant_storage does for ZeRO-3, and a per-row scale) plus a trainable
    low-rank update."""

    def __init__(self, dim, rank=2):
        super().__init__()
        self.codes = torch.nn.Parameter(torch.randint(-8, 8, (dim, dim)).float(), requires_grad=False)
        self.scale = torch.nn.Parameter(torch.rand(dim) / dim + 0.05, requires_grad=False)
        self.lora_a = torch.nn.Linear(dim, rank, bias=False)
        self.lora_b = torch.nn.Linear(rank, dim, bias=False)

    def forward(self, x):
        return StashedWeightMatmul.apply(x, self.codes, self.scale) + self.lora_b(self.lora_a(x))


class QuantizedLoRABlock(torch.nn.Module):
    """A trainable norm, so that the quantized base holds the block's only frozen parameters."""

    def __init__(self, dim):
        super().__init__()
        self.norm = torch.nn.LayerNorm(dim)
        self.proj = QuantizedLoRALinear(dim)

    def forward(self, x):
        return torch.relu(self.proj(self.norm(x)))


class Stack(torch.nn.Module):
    """Blocks applied in sequence, each under ``checkpointing``, then a trainable head."""

    def __init__(self, blocks, dim, checkpointing="module", repeat=1, bias=True, head_out=2):
        super().__init__()
        self.blocks = torch.nn.ModuleList(blocks)
        self.head = torch.nn.Linear(dim, head_out, bias=bias)
        self.checkpointing = checkpointing
        self.repeat = repeat  # > 1: every block runs again before its backward (a re-entered module)

    def forward(self, x):
        for _ in range(self.repeat):
            for block in self.blocks:
                x = run_checkpointed(block, self.checkpointing, x)
        return self.head(x).pow(2).mean()


class FullyCheckpointedStack(Stack):
    """Stack with its head checkpointed too: every module that holds parameters runs under
    ``checkpointing``, so every one of them is recomputed in each backward."""

    def forward(self, x):
        for block in self.blocks:
            x = run_checkpointed(block, self.checkpointing, x)
        return run_checkpointed(self.head, self.checkpointing, x).pow(2).mean()


def fully_checkpointed_stack(dim=8, depth=2, checkpointing="module"):
    return FullyCheckpointedStack([NormLinear(dim) for _ in range(depth)], dim, checkpointing)


class Gate(torch.nn.Module):
    """Two inputs, each through a Linear of its own, multiplied: a module whose input grads can
    come in different backwards."""

    def __init__(self, dim):
        super().__init__()
        self.a = torch.nn.Linear(dim, dim)
        self.b = torch.nn.Linear(dim, dim)

    def forward(self, u, v):
        return self.a(u) * self.b(v)


class TwoBranchModel(torch.nn.Module):
    """Two inputs, a Linear each, merged by a Gate, then a head; every module checkpointed."""

    def __init__(self, dim=8, checkpointing="module"):
        super().__init__()
        self.first = torch.nn.Linear(dim, dim)
        self.second = torch.nn.Linear(dim, dim)
        self.gate = Gate(dim)
        self.head = torch.nn.Linear(dim, 2)
        self.checkpointing = checkpointing

    def forward(self, x1, x2):
        def run(module, *inputs):
            return run_checkpointed(module, self.checkpointing, *inputs)

        merged = run(self.gate, run(self.first, x1), run(self.second, x2))
        return run(self.head, merged).pow(2).mean()


def frozen_norm_stack(dim=8, depth=2, checkpointing="module", relu=False, repeat=1, bias=True):
    blocks = [NormLinear(dim, relu=relu, bias=bias) for _ in range(depth)]
    for block in blocks:
        block.norm.requires_grad_(False)
    return Stack(blocks, dim, checkpointing, repeat=repeat, bias=bias)


class FrozenLayerThenHead(torch.nn.Module):
    """A frozen Linear, then a trainable head: fed inputs that need no grad, the frozen layer's
    output needs none either (a frozen embedding or a mask builder under LoRA)."""

    def __init__(self, dim):
        super().__init__()
        self.frozen = torch.nn.Linear(dim, dim).requires_grad_(False)
        self.head = torch.nn.Linear(dim, 2)

    def forward(self, x):
        return self.head(torch.relu(self.frozen(x))).pow(2).mean()


class EmbeddingNormStack(Stack):
    """A frozen embedding, then frozen-norm blocks (frozen_norm_stack) and a trainable head. Its
    output is made to require grad, as enable_input_require_grads() does for reentrant checkpointing."""

    def __init__(self, vocab, dim, depth, checkpointing):
        blocks = [NormLinear(dim) for _ in range(depth)]
        for block in blocks:
            block.norm.requires_grad_(False)
        super().__init__(blocks, dim, checkpointing)
        self.embedding = torch.nn.Embedding(vocab, dim).requires_grad_(False)

    def forward(self, ids):
        return super().forward(self.embedding(ids).requires_grad_())


class PassThroughProbe(torch.nn.Module):
    """Reads a frozen weight for a statistic and returns its input unchanged (a probe, an adapter
    switched off)."""

    def __init__(self, dim):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(dim), requires_grad=False)

    def forward(self, x):
        self.statistic = (x * self.weight).sum()
        return x


class ReenablesGrad(torch.nn.Module):
    """Turns grad back on inside its forward and uses its own trainable parameters there: called
    under torch.no_grad(), its output still has autograd history through them."""

    def __init__(self, dim):
        super().__init__()
        self.lin = torch.nn.Linear(dim, dim)
        self.scale = torch.nn.Parameter(torch.ones(dim))

    def forward(self, x):
        with torch.enable_grad():
            return self.lin(x) * self.scale


class NoGradProbeStack(Stack):
    """Blocks, then ``probe`` (default a PassThroughProbe) called under torch.no_grad(), then the
    head: torch hands the head what the probe returns, autograd history and all."""

    def __init__(self, blocks, dim, checkpointing="module", probe=None):
        super().__init__(blocks, dim, checkpointing)
        self.probe = probe if probe is not None else PassThroughProbe(dim)

    def forward(self, x):
        for block in self.blocks:
            x = run_checkpointed(block, self.checkpointing, x)
        with torch.no_grad():
            x = self.probe(x)
        return self.head(x).pow(2).mean()


def no_grad_probe_stack(dim=8, depth=2, checkpointing="module", reenables_grad=False):
    blocks = [NormLinear(dim) for _ in range(depth)]
    for block in blocks:
        block.norm.requires_grad_(False)
    return NoGradProbeStack(blocks, dim, checkpointing, probe=ReenablesGrad(dim) if reenables_grad else None)


def trainable_stack(dim=8, depth=2, checkpointing="module"):
    return Stack([NormLinear(dim) for _ in range(depth)], dim, checkpointing)


class DetachingBlock(NormLinear):
    """A frozen norm fed a detached copy of the block's input: nothing of the norm is saved for
    backward, so nothing may hold it gathered there."""

    def __init__(self, dim):
        super().__init__(dim)
        self.norm.requires_grad_(False)

    def forward(self, x):
        return self.lin(x) + self.norm(x.detach())


def detaching_stack(dim=8, depth=2, checkpointing="reentrant"):
    return Stack([DetachingBlock(dim) for _ in range(depth)], dim, checkpointing)


class StashedWeightLinear(torch.autograd.Function):
    """x @ weight.t() that keeps the trainable ``weight`` on ``ctx`` instead of saving it: backward
    reads the parameter itself, not a saved copy, so it must be gathered then."""

    @staticmethod
    def forward(ctx, x, weight):
        ctx.weight = weight
        ctx.save_for_backward(x)
        return x @ weight.t()

    @staticmethod
    def backward(ctx, grad):
        (x, ) = ctx.saved_tensors
        return grad @ ctx.weight, grad.t() @ x


class StashedLinear(torch.nn.Module):

    def __init__(self, dim):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(dim, dim) / dim**0.5)

    def forward(self, x):
        return StashedWeightLinear.apply(x, self.weight)


class GradientPenaltyBlock(torch.nn.Module):
    """A block whose forward differentiates through its first layer (a gradient penalty, as
    WGAN-GP or input-gradient regularisers compute it) and feeds that gradient on. Under a
    non-reentrant checkpoint the recompute runs this backward again, through the graph the
    recompute itself records. With ``stashed`` the first layer's backward reads its weight from
    ctx."""

    def __init__(self, dim, stashed=False):
        super().__init__()
        self.first = StashedLinear(dim) if stashed else torch.nn.Linear(dim, dim)
        self.second = torch.nn.Linear(dim, dim)

    def forward(self, x):
        (input_grad, ) = torch.autograd.grad(self.first(x).sin().sum(), x, create_graph=True)
        return self.second(input_grad).cos()


def gradient_penalty_stack(dim=8, depth=2, checkpointing="module", stashed=False):
    return Stack([GradientPenaltyBlock(dim, stashed) for _ in range(depth)], dim, checkpointing)


def lora_stack(dim=8, depth=2, checkpointing="module"):
    return Stack([LoRABlock(dim) for _ in range(depth)], dim, checkpointing)


def quantized_lora_stack(dim=8, depth=2, checkpointing="module"):
    return Stack([QuantizedLoRABlock(dim) for _ in range(depth)], dim, checkpointing)


def scaled_stack(dim=8, depth=2, checkpointing="module"):
    return Stack([ScaledBlock(dim) for _ in range(depth)], dim, checkpointing)


class EmbeddingBlock(torch.nn.Module):
    """A frozen embedding looked up by token ids inside a checkpointed block: its weight has no
    backward consumer at all."""

    def __init__(self, vocab, dim):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.lin = torch.nn.Linear(dim, dim)
        self.embed.requires_grad_(False)
        self.observer = None  # called in backward right after the Linear's backward

    def forward(self, ids, x):
        return probe(self.lin(x + self.embed(ids)), self.observer)


class EmbeddingModel(torch.nn.Module):

    def __init__(self, vocab=16, dim=8, checkpointing="module"):
        super().__init__()
        self.block = EmbeddingBlock(vocab, dim)
        self.head = torch.nn.Linear(dim, 1)
        self.checkpointing = checkpointing

    def forward(self, ids, x):
        return self.head(run_checkpointed(self.block, self.checkpointing, ids, x)).pow(2).mean()


def _make_output_require_grad(module, inputs, output):
    # what transformers' enable_input_require_grads() registers on the input embeddings
    output.requires_grad_(True)


class InputGradsEmbeddingModel(torch.nn.Module):
    """Frozen input embeddings whose output a forward hook turns into a leaf that requires grad, as
    transformers does whenever gradient checkpointing is enabled, in front of trainable blocks. The
    embedding has no backward: its graph ends at that leaf."""

    def __init__(self, vocab=16, dim=8, depth=2, checkpointing="module"):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.embed.requires_grad_(False)
        self.embed.register_forward_hook(_make_output_require_grad)
        self.stack = trainable_stack(dim, depth, checkpointing)

    def forward(self, ids):
        return self.stack(self.embed(ids))


class TwoBranchLeaf(torch.nn.Module):
    """A multi-output module (MoE-style) meant to be a z3 leaf: its backward hooks fire once per
    output, from several autograd threads."""

    def __init__(self, dim):
        super().__init__()
        self.norm_a = torch.nn.LayerNorm(dim)
        self.norm_b = torch.nn.LayerNorm(dim)
        self.lin_a = torch.nn.Linear(dim, dim)
        self.lin_b = torch.nn.Linear(dim, dim)
        self.norm_a.requires_grad_(False)
        self.norm_b.requires_grad_(False)

    def forward(self, x):
        return self.lin_a(self.norm_a(x)), self.lin_b(self.norm_b(x))


class LeafThenProduct(torch.nn.Module):
    """The leaf and an op that saves its outputs, in one checkpointed region: the recompute runs
    past the leaf, so the leaf's post-forward fires inside it."""

    def __init__(self, dim):
        super().__init__()
        self.leaf = TwoBranchLeaf(dim)

    def forward(self, x):
        a, b = self.leaf(x)
        return a * b


class LeafModel(torch.nn.Module):

    def __init__(self, dim=8, checkpointing="module"):
        super().__init__()
        self.block = LeafThenProduct(dim)
        self.head = torch.nn.Linear(dim, 2)
        self.checkpointing = checkpointing

    def forward(self, x):
        return self.head(run_checkpointed(self.block, self.checkpointing, x)).pow(2).mean()


class ReturnsOwnScale(torch.nn.Module):
    """Returns its frozen parameter to the caller: ZeRO-3 registers it as an external parameter of
    the parent."""

    def __init__(self, dim):
        super().__init__()
        self.lin = torch.nn.Linear(dim, dim)
        self.scale = torch.nn.Parameter(torch.rand(dim) + 0.5, requires_grad=False)

    def forward(self, x):
        return self.lin(x), self.scale


class ExternalParamBlock(torch.nn.Module):

    def __init__(self, dim):
        super().__init__()
        self.inner = ReturnsOwnScale(dim)
        self.norm = torch.nn.LayerNorm(dim)
        self.out = torch.nn.Linear(dim, dim)
        self.norm.requires_grad_(False)

    def forward(self, x):
        y, scale = self.inner(x)
        return self.out(self.norm(y * scale))


def external_param_stack(dim=8, depth=2, checkpointing="module"):
    return Stack([ExternalParamBlock(dim) for _ in range(depth)], dim, checkpointing)


class FailingBlock(NormLinear):
    """Raises from its forward when ``fail_in_recompute`` is set and the forward is a recompute."""

    def __init__(self, dim):
        super().__init__(dim)
        self.norm.requires_grad_(False)
        self.fail_in_recompute = False

    def forward(self, x):
        if self.fail_in_recompute and torch._C._current_graph_task_id() != -1:
            raise RuntimeError("injected failure during the recompute")
        return super().forward(x)


class FailOnceBackward(torch.autograd.Function):
    """Identity whose backward raises while ``armed[0]`` is set."""

    @staticmethod
    def forward(ctx, x, armed):
        ctx.armed = armed
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        if ctx.armed[0]:
            raise RuntimeError("injected failure in backward")
        return grad, None


class FailInBackwardBlock(NormLinear):
    """Raises in backward after the block's recompute, while ``armed[0]`` is set."""

    def __init__(self, dim):
        super().__init__(dim)
        self.norm.requires_grad_(False)
        self.armed = [False]

    def forward(self, x):
        # the failing node sits between norm and lin: lin's backward has triggered the recompute
        # and the norm is gathered and deferred when it raises
        x = FailOnceBackward.apply(self.norm(x), self.armed)
        return self.lin(x)


class UnusedOutputBlock(NormLinear):
    """A block that also computes an auxiliary output the loss does not use (kept for logging, as
    models keep hidden states or router statistics): the frozen norm that computes it is
    recomputed in backward, but its backward never runs."""

    def __init__(self, dim):
        super().__init__(dim)
        self.aux_norm = torch.nn.LayerNorm(dim)
        self.norm.requires_grad_(False)
        self.aux_norm.requires_grad_(False)
        self.aux = None

    def forward(self, x):
        self.aux = self.aux_norm(x)
        return super().forward(x)


class DetachedReader(torch.nn.Module):
    """A trainable Linear that reads its input detached (a stop-gradient branch)."""

    def __init__(self, dim):
        super().__init__()
        self.lin = torch.nn.Linear(dim, dim)

    def forward(self, x):
        return self.lin(x.detach())


class DroppedSideOutputBlock(NormLinear):
    """A block whose frozen side projection feeds a reader that reads it detached: the loss does
    not use the side projection's output, which nothing keeps, so its graph is freed with it and
    the projection has no backward (unlike UnusedOutputBlock, whose output is kept)."""

    def __init__(self, dim):
        super().__init__(dim)
        self.side = torch.nn.Linear(dim, dim)
        self.reader = DetachedReader(dim)
        self.norm.requires_grad_(False)
        self.side.requires_grad_(False)

    def forward(self, x):
        h = super().forward(x)
        return h + self.reader(self.side(h))


class KwargsScaledMatmul(torch.nn.Module):
    """A frozen weight read directly in forward (x @ W saves W itself, not a view) and a trainable
    scale, with its input passed by keyword, as transformers passes hidden_states to some layers.
    In backward, the scale's gradient is accumulated before the matmul's backward reads W."""

    def __init__(self, dim):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(dim, dim) / dim**0.5, requires_grad=False)
        self.scale = torch.nn.Parameter(torch.ones(dim))

    def forward(self, *, x):
        return (x @ self.weight) * self.scale


class StashedInputScaledMatmul(KwargsScaledMatmul):
    """KwargsScaledMatmul whose grad-requiring input comes through an attribute the caller sets
    (``stash``), with a positional argument that needs no grad: no hook can see that input."""

    def forward(self, zeros):
        return (self.stash @ self.weight) * self.scale + zeros


class KwargsStack(torch.nn.Module):
    """A trainable Linear, then blocks with a frozen weight and a trainable scale, called with
    their input by keyword (``inputs="keyword"``) or through an attribute (``"stash"``), under
    ``checkpointing`` "none" or "module", then a trainable head."""

    def __init__(self, dim=8, depth=2, checkpointing="module", inputs="keyword"):
        super().__init__()
        self.inp = torch.nn.Linear(dim, dim)
        block = KwargsScaledMatmul if inputs == "keyword" else StashedInputScaledMatmul
        self.blocks = torch.nn.ModuleList(block(dim) for _ in range(depth))
        self.head = torch.nn.Linear(dim, 2)
        self.checkpointing = checkpointing
        self.inputs = inputs

    def forward(self, x):
        x = self.inp(x)
        for block in self.blocks:
            if self.inputs == "keyword":
                x = block(x=x) if self.checkpointing == "none" else checkpoint(block, use_reentrant=False, x=x)
            else:
                block.stash = x
                zeros = torch.zeros_like(x).detach()
                x = block(zeros) if self.checkpointing == "none" else checkpoint(block, zeros, use_reentrant=False)
        return self.head(x).pow(2).mean()


class SharedFrozenNormModel(torch.nn.Module):
    """One frozen LayerNorm invoked twice per forward: on hidden states that require grad (armed
    through its input), and on a tensor that needs no grad whose output a forward hook makes a leaf
    that requires grad (transformers' enable_input_require_grads() pattern). The two invocations
    need different pre-backwards: the first must gather the norm for its backward."""

    def __init__(self, dim=8):
        super().__init__()
        self.inp = torch.nn.Linear(dim, dim)
        self.norm = torch.nn.LayerNorm(dim)
        self.norm.requires_grad_(False)
        self.norm.register_forward_hook(lambda module, args, output: output.requires_grad_(True)
                                        if not output.requires_grad else None)
        self.head = torch.nn.Linear(dim, 2)

    def forward(self, x):
        hidden = self.norm(self.inp(x))
        side = self.norm(torch.ones_like(x))
        return self.head(hidden + side).pow(2).mean()
