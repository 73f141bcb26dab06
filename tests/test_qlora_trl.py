"""Where the users of the fix come from: real QLoRA (bitsandbytes 4-bit base, PEFT LoRA) and TRL's
SFTTrainer, each under ZeRO-3 with non-reentrant gradient checkpointing, on one GPU.

GPU only: bitsandbytes' 4-bit training and TRL's bf16 training are what users run on GPUs, and
the CPU suite keeps the QLoRA stand-in (test_frozen_ckpt.py::test_quantized_base_keeps_weight_on_ctx).
They run at world size 1 (the 4-bit load places the whole model on one device, and one H200 is
enough), in a pool of their own. bitsandbytes, trl and datasets are not test requirements of the
suite; scripts/gpu-qlora-trl.sh installs them from carried wheels and runs this file on the
pristine and the patched tree.

Each test runs the reentrant configuration first (a loss reference that trains on every tree),
then the non-reentrant one, which must fail with the CheckpointError on a tree without patch 1
(``ZERO3_SERIES_PREFIX=0``) and, on the series, reach the reference's losses.
"""

import importlib.util

import pytest

from tests.harness import RankPool, ScenarioFailed
from tests.harness.pool import default_device
from tests.test_frozen_ckpt import _record, applied_patches, scenario_runner

QLORA = "tests.scenarios.qlora"
TRL = "tests.scenarios.trl_sft"
# bf16 compute (bitsandbytes dequantizes to bf16, ZeRO-3 trains in bf16): the two checkpointing
# modes compute the same operations, a few bf16 roundings apart at most
LOSS_RTOL = 1e-2

pytestmark = pytest.mark.skipif(default_device() != "cuda",
                                reason="real bitsandbytes 4-bit and TRL training run on a GPU "
                                "(ZERO3_TEST_DEVICE=cuda); on CPU the QLoRA stand-in covers the series")


def require(*modules):
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed: scripts/gpu-qlora-trl.sh installs them from carried wheels")


@pytest.fixture(scope="module")
def one_gpu_pool():
    pool = RankPool(1, name="qlora-trl")
    yield pool
    pool.close()


def run_non_reentrant(pool, request, target, **kwargs):
    """Like the suite's scenario runner, but on a tree without the fix the failure must be the
    CheckpointError this series is about, not any failure on the way there."""
    needed = request.node.get_closest_marker("needs_patch").args[0]
    applied = applied_patches()
    if applied >= needed:
        return scenario_runner(pool, request)(target, **kwargs)
    with pytest.raises(ScenarioFailed, match="CheckpointError") as failure:
        pool.run(target, **kwargs)
    _record(request, applied, needed, "failed as expected", failure.value)
    return None


def report_losses(request, result, reference):
    """Compares the non-reentrant run's losses (None where it failed as expected) with the
    reentrant reference's, and prints both on one line (scripts/gpu-qlora-trl.sh's table reads it)."""
    if result is None:
        return
    losses, expected = result[0]["losses"], reference["losses"]
    print(f"\n{request.node.name} losses: non-reentrant {[round(x, 4) for x in losses]}, "
          f"reentrant {[round(x, 4) for x in expected]}")
    assert losses == pytest.approx(expected, rel=LOSS_RTOL), (result, reference)


@pytest.mark.needs_patch(5)
@pytest.mark.invariants("I1")
def test_qlora_bnb_4bit_llama_non_reentrant(one_gpu_pool, request):
    """BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_storage=bf16), PEFT LoRA, ZeRO-3."""
    require("bitsandbytes", "peft")
    reference = one_gpu_pool.run(f"{QLORA}:qlora_llama", use_reentrant=True)[0]
    result = run_non_reentrant(one_gpu_pool, request, f"{QLORA}:qlora_llama", use_reentrant=False)
    report_losses(request, result, reference)


@pytest.mark.needs_patch(5)
@pytest.mark.invariants("I1")
def test_trl_sft_trainer_peft_zero3_non_reentrant(one_gpu_pool, request):
    """SFTTrainer with a ZeRO-3 config dict, PEFT LoRA and use_reentrant=False: TRL 1.16.0 turns
    it into True, the scenario turns it back (integrations/trl's patch makes that unnecessary)."""
    require("trl", "datasets", "peft")
    reference = one_gpu_pool.run(f"{TRL}:sft_lora", use_reentrant=True)[0]
    result = run_non_reentrant(one_gpu_pool, request, f"{TRL}:sft_lora", use_reentrant=False)
    report_losses(request, result, reference)
