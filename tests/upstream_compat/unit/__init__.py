# Stands in for upstream DeepSpeed's tests/unit package, so that "from unit.common import DistributedTest" works.
