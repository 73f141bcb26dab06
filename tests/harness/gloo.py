"""Workarounds for DeepSpeed's collectives in CPU rank processes: in-place gloo calls, and the
shm op that init_distributed would compile."""

import deepspeed.comm.comm
import deepspeed.ops


def skip_shm_op_build():
    """Keep init_distributed from JIT-compiling DeepSpeed's CPU shm all-reduce op.

    Call before deepspeed.init_distributed on the CPU accelerator. The build takes about a minute on
    2 cores, and only inference_all_reduce uses the op, only with LOCAL_SIZE set: training never
    does. Two ranks building it at once have also aborted at exit (std::terminate). Declaring the op
    incompatible makes build_shm_op() skip it.
    """
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def dealias_gloo_collectives():
    """Give gloo a separate input buffer when DeepSpeed all-gathers or reduce-scatters in place.

    DeepSpeed's parameter all-gather passes a slice of the output as the input, and its gradient
    reduce-scatter a slice of the input as the output. NCCL defines that in-place use; gloo does
    not, and now and then (more under CPU load) the result is wrong: on pristine v0.19.2 and with no
    frozen parameter too. The harness patches CPU ranks only, and only calls whose buffers overlap change.
    """
    backend = deepspeed.comm.comm.cdb
    if getattr(backend, "_zero3_tests_dealiased", False):
        return

    class _Completed:
        """The handle of a collective that has already finished."""

        def wait(self, *args, **kwargs):
            return True

        def is_completed(self):
            return True

    def dealiased(collective):

        def run(output_tensor, input_tensor, *args, async_op=False, **kwargs):
            if output_tensor.untyped_storage().data_ptr() != input_tensor.untyped_storage().data_ptr():
                return collective(output_tensor, input_tensor, *args, async_op=async_op, **kwargs)
            # run it synchronously: the copy must outlive the collective, and an asynchronous
            # handle would not keep it alive
            collective(output_tensor, input_tensor.clone(), *args, async_op=False, **kwargs)
            return _Completed() if async_op else None

        return run

    backend.all_gather_into_tensor = dealiased(backend.all_gather_into_tensor)
    backend.reduce_scatter_tensor = dealiased(backend.reduce_scatter_tensor)
    backend._zero3_tests_dealiased = True
