"""A workaround, in the CPU rank processes, for DeepSpeed's in-place collectives on gloo."""

import deepspeed.comm.comm


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

    def separate(output_tensor, input_tensor):
        if output_tensor.untyped_storage().data_ptr() == input_tensor.untyped_storage().data_ptr():
            return input_tensor.clone()
        return input_tensor

    all_gather_into_tensor = backend.all_gather_into_tensor
    reduce_scatter_tensor = backend.reduce_scatter_tensor

    def all_gather_dealiased(output_tensor, input_tensor, *args, **kwargs):
        return all_gather_into_tensor(output_tensor, separate(output_tensor, input_tensor), *args, **kwargs)

    def reduce_scatter_dealiased(output_tensor, input_tensor, *args, **kwargs):
        return reduce_scatter_tensor(output_tensor, separate(output_tensor, input_tensor), *args, **kwargs)

    backend.all_gather_into_tensor = all_gather_dealiased
    backend.reduce_scatter_tensor = reduce_scatter_dealiased
    backend._zero3_tests_dealiased = True
