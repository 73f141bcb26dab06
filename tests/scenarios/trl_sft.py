"""TRL's SFTTrainer with PEFT LoRA under a ZeRO-3 config dict and gradient checkpointing.

TRL (1.16.0 and earlier) forces ``use_reentrant=True`` for PEFT + ZeRO-3 + gradient checkpointing
(huggingface/trl#4951), even over an explicit ``use_reentrant=False``, because DeepSpeed crashed
there. This scenario asks for non-reentrant checkpointing, records whether the installed TRL
overrode it, and if so switches the model back to non-reentrant checkpointing after
``SFTTrainer.__init__``, before ``Trainer.train()`` enables checkpointing from the arguments, so
that the training runs the way the TRL user asked for. With integrations/trl's patch and a
DeepSpeed that carries the fix, TRL leaves the request alone and nothing is switched back.

Everything is made here: a tiny random-init Llama (tests/scenarios/hf_llama.py), a word-level
tokenizer over its 64-token vocabulary built with the ``tokenizers`` library, and a small
in-memory dataset of texts.
"""

import math
import shutil
import tempfile

import torch

import deepspeed  # noqa: F401  (the rank's DeepSpeed, imported before transformers looks for it)

from tests.harness import rank_context
from tests.scenarios.hf_llama import VOCAB, lora_config, tiny_llama_config
from tests.scenarios.qlora import checkpointing_use_reentrant
from tests.scenarios.zero3 import assert_quiescent, lifecycle_config, load_reference_weights

SPECIAL_TOKENS = ["<pad>", "<eos>", "<unk>"]
# the DeepSpeed gate that integrations/trl/0001-*.patch adds to trl/import_utils.py
TRL_GATE = "is_deepspeed_zero3_non_reentrant_checkpointing_supported"


def word_level_tokenizer():
    """A fast tokenizer whose vocabulary is the model's: three special tokens and w0, w1, ...
    split on whitespace. Nothing is downloaded."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = [f"w{i}" for i in range(VOCAB - len(SPECIAL_TOKENS))]
    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS + words)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend,
                                   pad_token="<pad>",
                                   eos_token="<eos>",
                                   unk_token="<unk>",
                                   model_max_length=32)


def text_dataset(rows):
    """``rows`` texts of 6 to 12 words, the same on every run."""
    from datasets import Dataset

    generator = torch.Generator().manual_seed(7)
    texts = []
    for _ in range(rows):
        length = int(torch.randint(6, 13, (1, ), generator=generator))
        ids = torch.randint(0, VOCAB - len(SPECIAL_TOKENS), (length, ), generator=generator)
        texts.append(" ".join(f"w{i}" for i in ids.tolist()))
    return Dataset.from_dict({"text": texts})


def sft_lora(*, use_reentrant, steps=3):
    """Trains a LoRA adapter with SFTTrainer under ZeRO-3 with gradient checkpointing, asking TRL
    for ``gradient_checkpointing_kwargs={"use_reentrant": use_reentrant}``.

    False: where TRL overrides it, the override is undone, so the training runs non-reentrant
    (v0.19.2: CheckpointError in the first backward). Checks: TRL overrode exactly where it should
    (always as released; with integrations/trl's patch, where its gate says DeepSpeed lacks the
    fix), the decoder layers ran the requested checkpointing, every step logged a finite loss and,
    non-reentrant, ZeRO-3 is quiescent after training. Returns the losses and what TRL did.
    """
    import trl
    from transformers import AutoModelForCausalLM, LlamaForCausalLM
    from trl import SFTConfig, SFTTrainer
    from trl import import_utils as trl_import_utils

    ctx = rank_context()
    # bf16 as a TRL user on a GPU trains; transformers refuses bf16 on a CPU without use_cpu,
    # which DeepSpeed does not take, so on CPU (runs by hand, not the suite) it is fp32
    bf16 = ctx.device_type == "cuda"
    ds_config = lifecycle_config(dtype="bf16" if bf16 else "fp32")
    ds_config["bf16"] = {"enabled": "auto"}
    ds_config["train_micro_batch_size_per_gpu"] = "auto"
    ds_config["gradient_accumulation_steps"] = "auto"
    ds_config["optimizer"]["params"]["lr"] = "auto"
    output_dir = tempfile.mkdtemp(prefix="zero3-trl-sft-")
    # constructing the config registers ZeRO-3 with transformers, which then builds the model
    # under deepspeed.zero.Init: keep it alive until training is over
    args = SFTConfig(output_dir=output_dir,
                     per_device_train_batch_size=2,
                     max_steps=steps,
                     learning_rate=1e-2,
                     lr_scheduler_type="constant",
                     warmup_steps=0,
                     gradient_checkpointing=True,
                     gradient_checkpointing_kwargs={"use_reentrant": use_reentrant},
                     deepspeed=ds_config,
                     bf16=bf16,
                     max_length=16,
                     packing=False,
                     dataset_num_proc=None,
                     dataloader_num_workers=0,
                     logging_steps=1,
                     save_strategy="no",
                     report_to=[],
                     disable_tqdm=True,
                     seed=0)
    try:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(tiny_llama_config())
        # zero.Init initialises on the accelerator: give the partitions a CPU-seeded model's
        # weights so that both checkpointing modes start from the same model
        torch.manual_seed(0)
        reference = LlamaForCausalLM(tiny_llama_config())
        load_reference_weights(model, reference)

        torch.manual_seed(1)  # LoRA A's initialisation, inside SFTTrainer's get_peft_model
        trainer = SFTTrainer(model=model,
                             args=args,
                             train_dataset=text_dataset(2 * steps * ctx.world_size),
                             processing_class=word_level_tokenizer(),
                             peft_config=lora_config())
        trl_kwargs = dict(trainer.args.gradient_checkpointing_kwargs or {})
        trl_forced_reentrant = not use_reentrant and trl_kwargs.get("use_reentrant") is True
        if not use_reentrant:
            # TRL as released overrides always; with integrations/trl's patch, exactly where its
            # DeepSpeed gate says the installed DeepSpeed lacks the fix
            gate = getattr(trl_import_utils, TRL_GATE, None)
            expected = True if gate is None else not gate()
            assert trl_forced_reentrant == expected, (f"TRL {trl.__version__} turned use_reentrant=False into "
                                                      f"{trl_kwargs}; expected an override: {expected}")
        if trl_forced_reentrant:
            # TRL's override, undone: Trainer.train() enables checkpointing from these arguments
            trainer.args.gradient_checkpointing_kwargs["use_reentrant"] = False

        trainer.train()
        # what the decoder layers ran with
        assert checkpointing_use_reentrant(trainer.model) == {use_reentrant}, trl_kwargs
        losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
        assert len(losses) == steps, trainer.state.log_history
        assert all(math.isfinite(loss) for loss in losses), losses
        engine = trainer.model_wrapped
        if not use_reentrant:
            assert_quiescent(engine, "after SFTTrainer.train()")
        engine.destroy()
    finally:
        shutil.rmtree(output_dir, ignore_errors=True)
    return {
        "losses": losses,
        "trl_forced_reentrant": trl_forced_reentrant,
        "trl_patched": hasattr(trl_import_utils, TRL_GATE),
    }


def trl_gate_feature(*, functions):
    """What integrations/trl's gate looks for in a DeepSpeed that calls itself older than 0.19.3:
    one of ``functions`` in the partitioned-parameter coordinator. The series must provide one,
    pristine v0.19.2 none (the gate would otherwise lift TRL's override where DeepSpeed crashes)."""
    from deepspeed.runtime.zero import partitioned_param_coordinator

    present = [name for name in functions if hasattr(partitioned_param_coordinator, name)]
    assert present, (f"DeepSpeed {deepspeed.__version__} defines none of {functions}: integrations/trl's gate "
                     "would keep forcing use_reentrant=True on it")
    return present
