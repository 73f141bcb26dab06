"""Hugging Face's client path: tiny Llama + PEFT LoRA + gradient_checkpointing_enable(), on the session's ranks.

These run in rank processes of their own (hf_pool, tests/conftest.py), shared with tests/test_v0198.py.
"""

import pytest

from tests.test_frozen_ckpt import scenario_runner

HF = "tests.scenarios.hf_llama"


@pytest.fixture
def scenario(hf_pool, request):
    return scenario_runner(hf_pool, request)


@pytest.mark.needs_patch(7)
@pytest.mark.invariants("I1", "I5")
@pytest.mark.parametrize("input_grads", [False, True], ids=["no-input-grads", "enable-input-require-grads"])
def test_hf_llama_peft_lora(scenario, input_grads):
    scenario(f"{HF}:llama_lora", input_grads=input_grads)


@pytest.mark.needs_patch(7)
@pytest.mark.invariants("I1")
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_hf_llama_peft_lora_half_precision(scenario, dtype):
    scenario(f"{HF}:llama_lora", dtype=dtype)


@pytest.mark.needs_patch(5)
@pytest.mark.invariants("I1")
def test_hf_trainer_with_zero3_config(scenario):
    """transformers' Trainer with a ZeRO-3 config dict: its own DeepSpeed integration builds the
    model under zero.Init and the engine; PEFT LoRA, non-reentrant gradient checkpointing."""
    scenario(f"{HF}:trainer_lora")


@pytest.mark.needs_patch(20)
@pytest.mark.invariants("I1")
@pytest.mark.parametrize("checkpointing", [None, "non-reentrant", "reentrant"], ids=["none", "non-reentrant", "reentrant"])
def test_hf_llama_peft_lora_classifier(scenario, checkpointing):
    """PEFT's sequence-classification recipe: the head trained in full through modules_to_save.
    v0.19.2, in every mode: AttributeError: 'Linear' object has no attribute 'ds_grads_remaining'."""
    scenario(f"{HF}:llama_lora_classifier", checkpointing=checkpointing)


@pytest.mark.needs_patch(7)
@pytest.mark.invariants("I1")
@pytest.mark.parametrize("checkpointing", [None, "non-reentrant"], ids=["none", "non-reentrant"])
def test_hf_mixtral_lora_z3_leaves(scenario, checkpointing):
    scenario(f"{HF}:mixtral_lora", checkpointing=checkpointing)


@pytest.mark.needs_patch(7)
@pytest.mark.invariants("I1")
@pytest.mark.parametrize("checkpointing", [None, "non-reentrant"], ids=["none", "non-reentrant"])
def test_hf_t5_lora_encoder_decoder(scenario, checkpointing):
    scenario(f"{HF}:t5_lora", checkpointing=checkpointing)
