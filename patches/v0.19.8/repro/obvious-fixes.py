import torch, deepspeed
class LayerScale(torch.nn.Module):  # returns its input and its own scale, which the caller applies
    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(8))
    def forward(self, x):
        return x, self.scale
model = torch.nn.ModuleDict({"inner": LayerScale(), "head": torch.nn.Linear(8, 1)})
inner, head = model["inner"], model["head"]  # inner is called as a function first, then as a module:
model.forward = lambda x: head(torch.mul(*inner(torch.mul(*inner.forward(x))))).pow(2).mean()
config = {"train_batch_size": 2, "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
          "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}}}
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
engine.backward(engine(torch.randn(2, 8)))
