import torch, deepspeed
from deepspeed.utils import set_z3_leaf_modules
class Model(torch.nn.Module):  # frozen embeddings, then a layer ZeRO-3 treats as a leaf (as MoE blocks)
    def __init__(self):
        super().__init__()
        self.embed, self.layer = torch.nn.Embedding(16, 8).requires_grad_(False), torch.nn.Linear(8, 8)
    def forward(self, ids):
        return self.layer(self.embed(ids)).pow(2).mean()
config = {"train_batch_size": 1, "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
          "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}}}
model = Model()
set_z3_leaf_modules(model, [torch.nn.Linear])
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.layer.parameters(), config=config)
engine.backward(engine(torch.tensor([[1, 2, 3]])))
engine.step()
