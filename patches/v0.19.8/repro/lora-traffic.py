import torch, deepspeed
from torch.utils.checkpoint import checkpoint
from deepspeed.runtime.zero.partitioned_param_coordinator import PartitionedParameterCoordinator as C
frozen, gather = [0, 0], C._PartitionedParameterCoordinator__all_gather_params
C._PartitionedParameterCoordinator__all_gather_params = lambda self, params, forward: gather(self, params, forward) or \
    frozen.__setitem__(ckpt, frozen[ckpt] + sum(p.ds_numel for p in params if not p.requires_grad))  # frozen elements
config = {"train_batch_size": 2, "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
          "stage3_max_reuse_distance": 0}, "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}}}
for ckpt in (0, 1):  # a block with a frozen norm, applied twice (the second run checkpointed or not)
    model = torch.nn.Sequential(torch.nn.LayerNorm(8).requires_grad_(False), torch.nn.Linear(8, 8), torch.nn.Tanh())
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model[1].parameters(), config=config)
    run = lambda x: checkpoint(engine.module, x, use_reentrant=False) if ckpt else engine.module(x)
    for step in range(2):
        frozen[ckpt] = 0
        engine.backward(run(engine(torch.randn(2, 8))).pow(2).mean())
assert frozen[0] == frozen[1], f"frozen elements all-gathered in a step: {frozen[1]} with checkpointing, {frozen[0]} without"
