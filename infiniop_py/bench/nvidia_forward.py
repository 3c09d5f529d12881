"""`bench --device nvidia --forward`: the training forwards on one GPU, each ours saving what our backward takes
(RMSNorm: rstd; LayerNorm: mean and rstd; BatchNorm: save_mean and save_invstd, the running statistics updated)
against torch's training forward (`_fused_rms_norm` where this torch has a kernel for it, else `rms_norm`;
`native_layer_norm`; `native_batch_norm`) and, where they run, Liger-Kernel's RMSNorm and LayerNorm forward and
cuDNN's BatchNorm forward, on the same device tensors. The shapes, the CUDA-graph timing and the table are the
backward benchmark's (nvidia.py); the bytes count one read of x and one write of y (forward.bytes_moved).

Issue 54 asks for our forwards in infiniop_py.torch wherever a benchmark on that device and dtype shows them
faster: on CUDA the torch integration runs torch's forwards until this table says otherwise.
"""

from . import cpu, forward, gpu_peers
from .nvidia import BATCH_NORM_EPS, LAYER_NORM_EPS, TimedCase

RMS_NORM_EPS = 1e-6
BATCH_NORM_MOMENTUM = 0.1


class GpuForwardCase(TimedCase):
    """nvidia.GpuCase's interface for a forward: ``ours()``, ``theirs()`` and each peer's call launch on the current
    stream (ours on ``stream``, which must then be current); ``outputs()`` gives each one's y."""

    def __init__(self, torch, op, dtype, shape, handle, device, generator, layout="channels_first", stream=None,
                 liger=None, cudnn=False):
        import infiniop_py as ip

        self.op, self.dtype, self.shape, self.layout = op, dtype, tuple(shape), layout
        self.direction = "forward"
        dt = cpu.torch_dtype(torch, dtype)
        self.bytes_moved = forward.bytes_moved(dtype, shape)
        self.parameter_dtype = dtype
        self.peers = {}
        self.phases = {}  # the backward's BatchNorm phases; a forward has none

        def random(*size, dtype=dt):
            return torch.randn(size, generator=generator, device=device, dtype=torch.float32).to(dtype)

        def statistic(size):
            return torch.empty(size, dtype=torch.float32, device=device)

        aten = torch.ops.aten
        if op == "rms_norm":
            x, w = random(*shape), random(shape[-1])
            tensors = [torch.empty_like(x), statistic(shape[:-1]), x, w]
            operator = ip.RMSNorm(handle, *tensors, eps=RMS_NORM_EPS)
            self.theirs, self.torch_method = _torch_rms_norm_forward(torch, x, w)
            if liger is not None:
                self.peer("liger_s", lambda: gpu_peers.liger_rms_norm_forward(liger, x, w, RMS_NORM_EPS))
        elif op == "layer_norm":
            x, w, b = random(*shape), random(shape[-1]), random(shape[-1])
            tensors = [torch.empty_like(x), statistic(shape[:-1]), statistic(shape[:-1]), x, w, b]
            operator = ip.LayerNorm(handle, *tensors, eps=LAYER_NORM_EPS)
            self.theirs = lambda: aten.native_layer_norm(x, list(shape[-1:]), w, b, LAYER_NORM_EPS)  # noqa: E731
            self.torch_method = "native_layer_norm"
            if liger is not None:
                self.peer("liger_s", lambda: gpu_peers.liger_layer_norm_forward(liger, x, w, b, LAYER_NORM_EPS))
        elif op == "batch_norm":
            # Training; F32 parameters and running statistics for 16-bit data, as autocast trains (and cuDNN needs).
            # Each implementation updates running statistics of its own.
            memory_format = torch.channels_last if layout == "channels_last" else torch.contiguous_format
            x = random(*shape).contiguous(memory_format=memory_format)
            channels = shape[1]
            weight, bias = random(channels, dtype=torch.float32), random(channels, dtype=torch.float32)
            self.parameter_dtype = "float32"

            def running():
                return torch.zeros(channels, device=device), torch.ones(channels, device=device)

            tensors = [torch.empty_like(x), statistic(channels), statistic(channels), *running(), x, weight, bias]
            operator = ip.BatchNorm(handle, *tensors, momentum=BATCH_NORM_MOMENTUM, eps=BATCH_NORM_EPS)
            torch_running = running()
            self.theirs = lambda: aten.native_batch_norm(  # noqa: E731
                x, weight, bias, *torch_running, True, BATCH_NORM_MOMENTUM, BATCH_NORM_EPS)
            self.torch_method = "native_batch_norm"
            if cudnn:
                self.peer("cudnn_s", lambda: gpu_peers.cudnn_batch_norm_forward(
                    torch, x, weight, bias, BATCH_NORM_MOMENTUM, BATCH_NORM_EPS))
        else:
            raise ValueError(f"op: no forward benchmark of {op!r} (forwards: {', '.join(forward.OPS)})")
        self.bind(torch, operator, tensors, device, stream)


def _torch_rms_norm_forward(torch, x, w):
    """(call, name): torch's fused RMSNorm forward (output and rstd) where this device has it, else rms_norm."""
    normalized = list(x.shape[-1:])
    has_kernel = getattr(torch._C, "_dispatch_has_kernel_for_dispatch_key", None)  # asked, as nvidia.py says why
    dispatch_key = "CUDA" if x.device.type == "cuda" else "CPU"
    if has_kernel is not None and has_kernel("aten::_fused_rms_norm", dispatch_key):
        return (lambda: torch.ops.aten._fused_rms_norm(x, normalized, w, RMS_NORM_EPS)), "_fused_rms_norm"
    return (lambda: (torch.nn.functional.rms_norm(x, normalized, w, RMS_NORM_EPS),)), "rms_norm"
