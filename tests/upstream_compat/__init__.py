"""Run DeepSpeed's upstream-style distributed unit tests (tests/unit/..., DistributedTest) without upstream's tests/.

The PyPI sdist of DeepSpeed ships no tests/, hence no tests/unit/common.py and no tests/conftest.py; a test file
that the patch series adds there still has to run. This package provides:

- unit/common.py: an importable ``unit.common`` with a ``DistributedTest`` that follows upstream's conventions;
- plugin.py: the pytest hook that runs such a test method on world_size rank processes (tests.harness);
- run.py: ``python -m tests.upstream_compat.run <deepspeed-tree> [pytest args]``.

In a real upstream checkout, run upstream's own harness instead (cd <checkout>/tests && pytest unit/...).
"""
