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


def may_run_a_module_twice(case):
    """Whether a module may run more than once per micro-batch: several forwards before one backward,
    an op that calls its child more than once, or two calls of the same child index (deliberately
    broad: the two calls may belong to different parents)."""
    tree = list(nodes(case))
    calls = [op[1] % len(node["children"]) for node in tree for op in node["ops"]
             if op[0] in ("child", "nograd") and node["children"]]
    return (case["forwards"] > 1 or len(calls) != len(set(calls))
            or any(op[0] == "child" and op[3] > 1 for node in tree for op in node["ops"]))
