"""Hugging Face's real client path: a tiny Llama (random init from a config, nothing downloaded)
with PEFT LoRA adapters and ``gradient_checkpointing_enable()`` (non-reentrant)."""

import functools
import importlib.util
import math

import pytest
import torch

import deepspeed

from tests.scenarios.zero3 import (DTYPES, assert_quiescent, initialize, lifecycle_config, load_reference_weights,
                                   skip_unless_dtype_supported, train)

VOCAB = 64


class CausalLMLoss(torch.nn.Module):
    """Makes the language model's loss the module output, as a training loop would take it."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids, labels=input_ids, use_cache=False).loss


def tiny_llama_config():
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=VOCAB,
                       hidden_size=32,
                       intermediate_size=64,
                       num_hidden_layers=2,
                       num_attention_heads=4,
                       num_key_value_heads=2,
                       max_position_embeddings=64,
                       tie_word_embeddings=False)


def lora_config():
    from peft import LoraConfig

    return LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])


def tiny_llama_lora(input_grads):
    from peft import get_peft_model
    from transformers import LlamaForCausalLM

    config = tiny_llama_config()
    model = LlamaForCausalLM(config)
    lora = lora_config()
    # fp32 adapters on a bf16 base trip a separate mixed-dtype all-gather bug in v0.19.2
    model = get_peft_model(model, lora, autocast_adapter_dtype=False)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if input_grads:
        model.enable_input_require_grads()
    # LoRA B starts at zero, which would make every LoRA A gradient zero in the first step
    for name, param in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.02)
    return CausalLMLoss(model)


def _finish_peft_model(model, checkpointing):
    """Turns on the checkpointing asked for and gives LoRA B non-zero weights (at zero, every LoRA A
    gradient of the first step would be zero)."""
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": checkpointing == "reentrant"})
    for name, param in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.02)
    return model


def _train_from_reference(factory, make_inputs, *, steps, prepare=None, check=None):
    """The torch reference from factory(), then the ZeRO-3 model from the same seed under zero.Init
    with the reference's weights (``prepare(model)`` before deepspeed.initialize, ``check(engine)``
    after it); trains both side by side on make_inputs(step, device)."""
    config = lifecycle_config()
    torch.manual_seed(0)
    reference = factory()
    torch.manual_seed(0)
    with deepspeed.zero.Init(config_dict_or_path=config):
        model = factory()
    load_reference_weights(model, reference)
    if prepare is not None:
        prepare(model)
    engine = initialize(model, config)
    if check is not None:
        check(engine)
    reference = reference.to(device=engine.device)
    engine.train()
    reference.train()
    try:
        return train(engine, reference, lambda step: make_inputs(step, engine.device), steps=steps, exact=False)
    finally:
        engine.destroy()


def _token_ids(step, device, *, low=0):
    """(ids of shape (2, 8), the generator that drew them), seeded by the step."""
    generator = torch.Generator().manual_seed(step)
    return torch.randint(low, VOCAB, (2, 8), generator=generator).to(device), generator


class ClassificationLoss(torch.nn.Module):
    """Makes a sequence classifier's loss the module output."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, labels):
        return self.model(input_ids=input_ids, labels=labels).loss


def tiny_llama_lora_classifier(checkpointing):
    """PEFT's sequence-classification recipe: LoRA on the attention projections and the new
    classification head trained in full, which get_peft_model wraps in a ModulesToSaveWrapper."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForSequenceClassification

    config = tiny_llama_config()
    config.num_labels = 3
    model = LlamaForSequenceClassification(config)
    # where the last token of each row is; set after construction: under zero.Init the embedding's
    # padding row cannot be zeroed in a partitioned weight
    model.config.pad_token_id = 0
    lora = LoraConfig(task_type="SEQ_CLS", r=4, lora_alpha=8, lora_dropout=0.0,
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    return ClassificationLoss(_finish_peft_model(get_peft_model(model, lora, autocast_adapter_dtype=False), checkpointing))


def llama_lora_classifier(*, checkpointing="non-reentrant", steps=2):
    """PEFT LoRA sequence classification (modules_to_save head) under zero.Init. v0.19.2, with or
    without checkpointing: AttributeError: 'Linear' object has no attribute 'ds_grads_remaining' in
    the first forward (the wrapper forwards hasattr(wrapper, "post_bwd_fn") to the head it wraps)."""

    def make_inputs(step, device):
        ids, generator = _token_ids(step, device, low=1)  # 0 is the padding token
        return ids, torch.randint(0, 3, (2, ), generator=generator).to(device)

    return _train_from_reference(functools.partial(tiny_llama_lora_classifier, checkpointing), make_inputs,
                                 steps=steps)


def tiny_mixtral_lora(checkpointing):
    """A two-layer Mixtral (4 experts, top 2) with PEFT LoRA on the attention projections: experts
    and router frozen."""
    from peft import get_peft_model
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                           num_experts_per_tok=2, max_position_embeddings=64, tie_word_embeddings=False)
    model = get_peft_model(MixtralForCausalLM(config), lora_config(), autocast_adapter_dtype=False)
    return CausalLMLoss(_finish_peft_model(model, checkpointing))


def mixtral_lora(*, checkpointing="non-reentrant", steps=2):
    """MoE with LoRA: the sparse MoE blocks are z3 leaves (v0.19.8 makes Mixtral's its default
    leaves; on v0.19.2 set_z3_leaf_modules sets them, as users of v0.19.2 do). v0.19.2,
    non-reentrant: CheckpointError (recomputed metadata differs); without checkpointing the first
    layer's LoRA A weights stay gathered after backward."""
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    from deepspeed.utils import set_z3_leaf_modules, z3_leaf_module

    def leaves_by_hand(model):
        # releases before zero_optimization.leaf_module (whose default classes v0.19.8 applies in
        # deepspeed.initialize) have no default leaves
        if importlib.util.find_spec("deepspeed.runtime.zero.leaf_module_config") is None:
            set_z3_leaf_modules(model, [MixtralSparseMoeBlock])

    def two_leaves(engine):
        assert sum(z3_leaf_module(module) for module in engine.module.modules()) == 2, "the MoE blocks are z3 leaves"

    return _train_from_reference(functools.partial(tiny_mixtral_lora, checkpointing),
                                 lambda step, device: _token_ids(step, device)[:1],
                                 steps=steps,
                                 prepare=leaves_by_hand,
                                 check=two_leaves)


class Seq2SeqLoss(torch.nn.Module):
    """Makes an encoder-decoder's loss the module output (the labels are the inputs reversed)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids, labels=input_ids.flip(-1), use_cache=False).loss


def tiny_t5_lora(checkpointing):
    """A T5 with two encoder and two decoder layers and PEFT LoRA on the attention's q and v; the
    word embedding is shared by the encoder, the decoder and the head."""
    from peft import LoraConfig, get_peft_model
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2,
                      num_heads=4, dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0)
    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q", "v"])
    model = get_peft_model(T5ForConditionalGeneration(config), lora, autocast_adapter_dtype=False)
    return Seq2SeqLoss(_finish_peft_model(model, checkpointing))


def t5_lora(*, checkpointing="non-reentrant", steps=2):
    """An encoder-decoder with LoRA under zero.Init. v0.19.2, non-reentrant: CheckpointError
    (recomputed metadata differs)."""
    return _train_from_reference(functools.partial(tiny_t5_lora, checkpointing),
                                 lambda step, device: _token_ids(step, device, low=1)[:1], steps=steps)


def llama_lora(*, input_grads=False, zero_init=True, dtype="fp32", steps=2):
    """v0.19.2: CheckpointError on the frozen RMSNorm weights (and, under zero.Init, the frozen
    base projections); without input grads the first decoder layer's LoRA weights also leak."""
    reason = skip_unless_dtype_supported(dtype)
    if reason:
        pytest.skip(reason)
    config = lifecycle_config(dtype=dtype)
    torch.manual_seed(0)
    reference = tiny_llama_lora(input_grads)
    torch.manual_seed(0)
    if zero_init:
        with deepspeed.zero.Init(config_dict_or_path=config):
            model = tiny_llama_lora(input_grads)
        load_reference_weights(model, reference)
    else:
        model = tiny_llama_lora(input_grads)
    engine = initialize(model, config)
    reference = reference.to(device=engine.device, dtype=DTYPES[dtype])
    engine.train()
    reference.train()

    def make_inputs(step):
        generator = torch.Generator().manual_seed(step)
        return (torch.randint(0, VOCAB, (2, 8), generator=generator).to(engine.device), )

    result = train(engine, reference, make_inputs, steps=steps, exact=False)
    engine.destroy()
    return result


def trainer_lora(*, steps=3):
    """transformers' own DeepSpeed integration: Trainer with a ZeRO-3 config dict, PEFT LoRA and
    gradient_checkpointing (non-reentrant). The first logged loss equals the reference's, training
    runs its steps, and ZeRO-3 is quiescent afterwards. v0.19.2: CheckpointError."""
    import tempfile

    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    try:
        with tempfile.TemporaryDirectory(prefix="zero3-trainer-", ignore_cleanup_errors=True) as output_dir:
            return _train_with_trainer(output_dir, steps)
    finally:
        # TrainingArguments(deepspeed=...) registers the ZeRO-3 config with transformers for the whole
        # process: the next scenario in this rank process would build even its torch reference model
        # under zero.Init ("RuntimeError: 'weight' must be 2-D")
        unset_hf_deepspeed_config()


def _train_with_trainer(output_dir, steps):
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    ds_config = lifecycle_config()
    ds_config["train_micro_batch_size_per_gpu"] = "auto"
    ds_config["gradient_accumulation_steps"] = "auto"
    ds_config["optimizer"]["params"]["lr"] = "auto"
    # constructing the arguments registers the ZeRO-3 config with transformers, which then builds
    # the model under deepspeed.zero.Init: keep them alive until training is over
    args = TrainingArguments(output_dir=output_dir,
                             per_device_train_batch_size=2,
                             max_steps=steps,
                             learning_rate=1e-2,
                             lr_scheduler_type="constant",
                             gradient_checkpointing=True,
                             gradient_checkpointing_kwargs={"use_reentrant": False},
                             deepspeed=ds_config,
                             logging_steps=1,
                             save_strategy="no",
                             report_to=[],
                             disable_tqdm=True)
    config = tiny_llama_config()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    lora = lora_config()
    model = get_peft_model(model, lora, autocast_adapter_dtype=False)
    torch.manual_seed(1)
    for name, param in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.02)

    # the reference, a plain torch model, and the ZeRO model start from the same weights
    reference = tiny_llama_lora(input_grads=False).model
    load_reference_weights(model, reference)

    ids = torch.randint(0, VOCAB, (8, ), generator=torch.Generator().manual_seed(5))
    dataset = [{"input_ids": ids, "labels": ids} for _ in range(2 * steps * 2)]
    reference.train()
    expected = reference(input_ids=ids[None].repeat(2, 1), labels=ids[None].repeat(2, 1)).loss.item()

    trainer = Trainer(model=model, args=args, train_dataset=dataset)
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == steps, trainer.state.log_history
    # Trainer normalises the loss by the token count gathered across ranks and logs a rank
    # average: not bit for bit the plain forward's (0.07% apart here), so compare to 1%
    assert abs(losses[0] -
               expected) < 1e-2 * expected, f"first loss {losses[0]} differs from the reference's {expected}"
    assert all(math.isfinite(loss) for loss in losses), losses
    engine = trainer.model_wrapped
    assert_quiescent(engine, "after Trainer.train()")
    engine.destroy()
    return {"losses": losses, "reference_first_loss": expected}
