import inspect, torch, deepspeed
model = torch.nn.Sequential(torch.nn.LayerNorm(8), torch.nn.ReLU(), torch.nn.LayerNorm(8))
config = {"train_batch_size": 1, "zero_optimization": {"stage": 3},
          "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}}}
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
bind, binds = inspect.Signature.bind, []
def counting_bind(signature, *args, **kwargs):  # Function.apply calls it when setup_context is defined
    binds.append(signature)
    return bind(signature, *args, **kwargs)
inspect.Signature.bind = counting_bind
loss = engine(torch.randn(1, 8, requires_grad=True)).sum()
inspect.Signature.bind = bind
engine.backward(loss)
assert not binds, f"{len(binds)} signature binds in one forward of four modules"
