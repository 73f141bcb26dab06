"""Questions about the shape of a fuzz case (the format is described in tests/scenarios/fuzz_lifecycle.py).

Plain Python, no torch or DeepSpeed: the parent process (which draws cases and decides which are known
findings) and the ranks (which decide what invariant I10 promises) ask the same questions.
"""


def nodes(case):
    """Every module of the case's tree (a node listed twice comes twice)."""
    stack = [case["model"]]
    while stack:
        node = stack.pop()
        stack.extend(node["children"])
        yield node


def _modules_in_order(node, inside_z3_leaf=False):
    """The case's modules in the order the model registers them (a node listed twice is two modules),
    each with whether it is, or is inside, a z3 leaf."""
    inside = inside_z3_leaf or node["z3_leaf"]
    yield node, inside
    for child in node["children"]:
        yield from _modules_in_order(child, inside)


def reads_a_z3_leaf_vector_externally(case):
    """Whether a module reads another module's vector as an external parameter (op "external")
    where the reader or the owner is, or is inside, a z3 leaf. The owner is picked as FuzzModel
    picks it: among the other modules that have a vector, in registration order."""
    modules = list(_modules_in_order(case["model"]))
    for index, (node, reader_in_leaf) in enumerate(modules):
        owners = [owner_in_leaf for other, (owner, owner_in_leaf) in enumerate(modules)
                  if other != index and owner["params"]["s"] != "none"]
        for op in node["ops"]:
            if op[0] == "external" and owners and (reader_in_leaf or owners[op[1] % len(owners)]):
                return True
    return False


def may_run_a_module_twice(case):
    """Whether a module may run more than once per micro-batch: several forwards before one backward,
    an op that calls its child more than once, or two calls of the same child index (deliberately
    broad: the two calls may belong to different parents)."""
    tree = list(nodes(case))
    calls = [op[1] % len(node["children"]) for node in tree for op in node["ops"]
             if op[0] in ("child", "nograd") and node["children"]]
    return (case["forwards"] > 1 or len(calls) != len(set(calls))
            or any(op[0] == "child" and op[3] > 1 for node in tree for op in node["ops"]))


def returns_a_parameter_through_a_reentrant_checkpoint(case):
    """Whether a child checkpointed with use_reentrant=True returns its own parameter (output
    "param"). Torch's CheckpointFunction returns that parameter as an output of its own and so gives
    it a grad_fn (a frozen one starts to require grad); backward through it then reruns the same
    checkpoint from inside its own backward without end, in plain torch as under ZeRO-3. Such a case
    is not a valid torch model."""
    for node in nodes(case):
        for op in node["ops"]:
            if op[0] == "child" and op[2] == "reentrant" and node["children"]:
                child = node["children"][op[1] % len(node["children"])]
                if child["output"] == "param" and child["params"]["s"] != "none":
                    return True
    return False
