import torch, deepspeed
from torch.utils.checkpoint import checkpoint
class Model(torch.nn.Module):  # one layer applied twice, checkpointed with use_reentrant=True
    def __init__(self):
        super().__init__()
        self.layer, self.head = torch.nn.Linear(8, 8), torch.nn.Linear(8, 1)
    def forward(self, x):
        for _ in range(2):
            x = checkpoint(self.layer, x, use_reentrant=True)
        return self.head(x).pow(2).mean()
config = {"train_batch_size": 1, "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
          "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}}}
model = Model()
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
engine.backward(engine(torch.randn(2, 8, requires_grad=True)))
