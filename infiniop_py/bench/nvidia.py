"""GPU benchmark (``bench --device nvidia``): our operators vs PyTorch CUDA on the same device tensors, timed with
CUDA events on one stream, against a device-to-device copy measured in the same run.

PyTorch runs its fused backward kernels (LayerNorm ``native_layer_norm_backward``, BatchNorm
``native_batch_norm_backward``, RMSNorm ``_fused_rms_norm_backward``, or the autograd backward of ``rms_norm``
where that has no kernel), fed with the statistics of its own forward on the same data. Ours is the bare C call of
an operator object made once, so neither side pays for Python checks in the timed loop beyond its own dispatch.
"""

import statistics

from . import cpu
from . import timing

# The issue-3 shapes, plus large BF16-friendly RMS/LN ones with D >= 1024 that fill a GPU.
ROW_SHAPES = cpu.ROW_SHAPES + [(16384, 4096), (65536, 1024)]
BATCH_SHAPES = cpu.BATCH_SHAPES
COPY_BYTES = 1 << 29  # 512 MiB: far beyond any GPU's L2
LAYER_NORM_EPS = 1e-5


class Unavailable(Exception):
    """The GPU benchmark cannot run here; the message says why."""


def require_cuda(device_id):
    """torch, once it is certain that both torch and this library can use NVIDIA device ``device_id``."""
    from .._ffi import ffi, libraries

    try:
        import torch
    except ImportError:
        raise Unavailable("torch is not installed (it provides the CUDA data, the timers and the baseline)") from None
    if not torch.cuda.is_available():
        raise Unavailable(f"torch {torch.__version__} cannot use CUDA (a build without CUDA, or no GPU or driver)")
    count = ffi.new("int *")
    status = libraries().rt.infinirtGetDeviceCount(1, count)  # INFINI_DEVICE_NVIDIA
    if status != 0:
        raise Unavailable(f"{libraries().op_path} has no CUDA backend (built without nvcc)")
    if not 0 <= device_id < count[0]:
        raise Unavailable(f"no NVIDIA device {device_id}: the library sees {count[0]}")
    return torch


class GpuCase:
    """One case on one torch device: ``ours()`` and ``theirs()`` launch on the current stream and return nothing;
    ``outputs()`` gives (ours, torch's) main gradient, to check both computed the same thing."""

    def __init__(self, torch, op, dtype, shape, handle, device, generator):
        import infiniop_py as ip

        self.op, self.dtype, self.shape = op, dtype, tuple(shape)
        dt = cpu.torch_dtype(torch, dtype)
        self.bytes_moved = cpu.bytes_moved(dtype, shape)

        def random(*size):
            return torch.randn(size, generator=generator, device=device, dtype=torch.float32).to(dt)

        aten = torch.ops.aten
        if op == "rms_norm":
            grad_y, x, w = random(*shape), random(*shape), random(shape[-1])
            tensors = [torch.empty_like(grad_y), torch.empty_like(w), grad_y, x, w]
            operator_class = ip.RMSNormBackward
            self.theirs, self.torch_method = _torch_rms_norm_backward(torch, grad_y, x, w)
        elif op == "layer_norm":
            x32 = torch.randn(shape, generator=generator, device=device)
            mean = x32.mean(-1, keepdim=True)
            std = (x32.var(-1, unbiased=False, keepdim=True) + LAYER_NORM_EPS).sqrt()
            xhat, std_dev = ((x32 - mean) / std).to(dt), std[..., 0].to(dt)
            grad_output, weight, x = random(*shape), random(shape[-1]), x32.to(dt)
            tensors = [torch.empty_like(grad_output), torch.empty_like(weight), torch.empty_like(weight),
                       grad_output, weight, xhat, std_dev]
            operator_class = ip.LayerNormBackward
            _, saved_mean, saved_rstd = aten.native_layer_norm(x, list(shape[-1:]), weight, weight, LAYER_NORM_EPS)
            self.theirs = lambda: aten.native_layer_norm_backward(  # noqa: E731
                grad_output, x, list(shape[-1:]), saved_mean, saved_rstd, weight, weight, [True, True, True])
            self.torch_method = "native_layer_norm_backward"
        else:
            x, grad_output, weight = random(*shape), random(*shape), random(shape[1])
            x32 = x.float()
            running_mean = x32.mean((0, 2)).to(dt)
            running_var = x32.var((0, 2), unbiased=False).to(dt)
            tensors = [torch.empty_like(x), torch.empty_like(weight), torch.empty_like(weight),
                       x, grad_output, weight, running_mean, running_var]
            operator_class = ip.BatchNormBackward
            # The seed has no epsilon: torch's training statistics with eps = 0 are the same ones.
            _, saved_mean, saved_invstd = aten.native_batch_norm(x, weight, weight, None, None, True, 0.0, 0.0)
            self.theirs = lambda: aten.native_batch_norm_backward(  # noqa: E731
                grad_output, x, weight, None, None, saved_mean, saved_invstd, True, 0.0, [True, True, True])
            self.torch_method = "native_batch_norm_backward"
        self._tensors = tensors
        self.operator = operator_class(handle, *tensors)
        workspace = torch.empty(max(self.operator.workspace_size, 1), dtype=torch.uint8, device=device)
        self._workspace = workspace
        self.ours = timing.native_call(self.operator, [t.data_ptr() for t in tensors], workspace.data_ptr(),
                                      _current_stream_address(torch, device))

    def outputs(self):
        """(our main gradient, torch's), after a run of each."""
        self.ours()
        theirs = self.theirs()
        return self._tensors[0], theirs[0]

    def close(self):
        self.operator.close()


def _current_stream_address(torch, device):
    return torch.cuda.current_stream(device).cuda_stream if torch.device(device).type == "cuda" else 0


def _torch_rms_norm_backward(torch, grad_y, x, w):
    """(call, name): torch's fused RMSNorm backward where this device has it, else the autograd backward of
    rms_norm (eps = 0, as the seed)."""
    aten = torch.ops.aten
    normalized = list(x.shape[-1:])
    # Asked first, not found out by a failing call: torch raises a C++ exception there, which the sanitizer stage's
    # preloaded ASan runtime cannot intercept (the CPU has no such kernel).
    has_kernel = getattr(torch._C, "_dispatch_has_kernel_for_dispatch_key", None)
    dispatch_key = "CUDA" if x.device.type == "cuda" else "CPU"
    try:
        if has_kernel is not None and not has_kernel("aten::_fused_rms_norm_backward", dispatch_key):
            raise NotImplementedError(f"no {dispatch_key} kernel")
        _, rstd = aten._fused_rms_norm(x, normalized, w, 0.0)
        aten._fused_rms_norm_backward(grad_y, x, normalized, rstd, w, [True, True])
    except (AttributeError, NotImplementedError, RuntimeError):
        tx, tw = x.detach().requires_grad_(), w.detach().requires_grad_()
        y = torch.nn.functional.rms_norm(tx, normalized, tw, eps=0.0)
        return (lambda: torch.autograd.grad(y, (tx, tw), grad_y, retain_graph=True)), "autograd of rms_norm"
    return (lambda: aten._fused_rms_norm_backward(grad_y, x, normalized, rstd, w, [True, True])), \
        "_fused_rms_norm_backward"


def event_seconds(torch, run, batches=20, batch_ms=1.0):
    """Median GPU time of one run(): batches of back-to-back calls between two CUDA events on the current
    stream, each batch lasting about ``batch_ms``, so the CPU keeps ahead and launch gaps do not count."""
    for _ in range(3):  # warm-up: first-call set-up, caches, clocks
        run()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run()
    end.record()
    end.synchronize()
    calls = max(1, min(1000, int(batch_ms / max(start.elapsed_time(end), 1e-3))))
    times = []
    for _ in range(batches):
        start.record()
        for _ in range(calls):
            run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / calls)
    return statistics.median(times)


def copy_bandwidth(torch, device, batches):
    """Device-to-device copy of COPY_BYTES with torch, in bytes/s (read + write counted)."""
    source = torch.empty(COPY_BYTES, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    seconds = event_seconds(torch, lambda: target.copy_(source), batches)
    del source, target
    return 2 * COPY_BYTES / seconds


def gpu_description(torch, device):
    properties = torch.cuda.get_device_properties(device)
    return (f"{properties.name} ({properties.total_memory / 2**30:.0f} GiB, {properties.multi_processor_count} SMs, "
            f"sm_{properties.major}{properties.minor}), CUDA {torch.version.cuda}")


def cases(ops, dtypes, quick):
    for op in ops:
        shapes = BATCH_SHAPES if op == "batch_norm" else ROW_SHAPES
        for dtype in dtypes:
            for shape in shapes[:1] if quick else shapes:
                yield op, dtype, shape


def run(args):
    """The report of cpu.format_table for NVIDIA device ``args.device_id`` (Unavailable if it cannot run)."""
    import infiniop_py as ip

    torch = require_cuda(args.device_id)
    device = f"cuda:{args.device_id}"
    torch.cuda.set_device(device)
    batches = max(args.repeats, 20)
    copy = copy_bandwidth(torch, device, batches)
    generator = torch.Generator(device=device).manual_seed(0)
    planned = list(cases(args.ops, args.dtypes, args.quick))
    results = []
    with ip.Handle("nvidia", args.device_id) as handle:
        for index, (op, dtype, shape) in enumerate(planned):
            timing.progress(index, len(planned), f"{op} {dtype} {shape}")
            case = GpuCase(torch, op, dtype, shape, handle, device, generator)
            try:
                ours_s = event_seconds(torch, case.ours, batches)
                torch_s = event_seconds(torch, case.theirs, batches)
                ours_out, torch_out = case.outputs()
                difference = float((ours_out.float() - torch_out.float()).abs().max()
                                   / torch_out.float().abs().max().clamp_min(1e-30))
            finally:
                case.close()
            results.append({
                "op": op, "dtype": dtype, "shape": list(shape), "ours_s": ours_s, "torch_s": torch_s,
                "ours_bandwidth": case.bytes_moved / ours_s, "torch_bandwidth": case.bytes_moved / torch_s,
                "torch_method": case.torch_method, "max_relative_difference_vs_torch": difference,
            })
            del case
        timing.progress(len(planned), len(planned), "done")
    return {
        "machine": gpu_description(torch, device), "threads": None, "copy_bandwidth": copy,
        "copy_method": "torch copy_ of 512 MiB, device to device, same run",
        "torch_version": torch.__version__, "functional_overhead_s": None, "results": results,
    }
