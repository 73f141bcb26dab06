"""A stand-in for upstream DeepSpeed's tests/unit/common.py: the DistributedTest base class and its knobs.

Only the class attributes are defined here; tests/upstream_compat/plugin.py does the running. Semantics
follow upstream: ``requires_cuda_env`` skips only when the accelerator reports itself unavailable, which the
CPU accelerator (DS_ACCELERATOR=cpu) never does.
"""

import os

from deepspeed.accelerator import get_accelerator

DEEPSPEED_TEST_TIMEOUT = int(os.environ.get("DS_UNITTEST_TIMEOUT", "600"))


class DistributedTest:
    """Base class of a distributed test: each ``test_*`` method runs on every rank of ``world_size`` processes.

    Class attributes (override in a subclass): ``world_size`` (int, or list for one run per size; a method can
    override it with ``@pytest.mark.world_size(n)`` or a ``world_size`` parameter), ``backend``,
    ``init_distributed`` (call deepspeed.init_distributed and a barrier first), ``set_dist_env`` (set
    MASTER_ADDR, MASTER_PORT, RANK, LOCAL_RANK, WORLD_SIZE), ``requires_cuda_env``, ``reuse_dist_env`` (keep
    the processes for the class's next test) and ``exec_timeout`` (seconds; env DS_UNITTEST_TIMEOUT).
    Fixture and parameter values are sent to the ranks, so they must be picklable. The class-scoped
    ``class_tmpdir`` fixture comes from tests/upstream_compat/plugin.py.
    """

    is_dist_test = True
    world_size = 2
    backend = get_accelerator().communication_backend_name()
    init_distributed = True
    set_dist_env = True
    requires_cuda_env = True
    reuse_dist_env = False
    exec_timeout = DEEPSPEED_TEST_TIMEOUT
