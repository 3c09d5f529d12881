"""Host time per call (``infiniop-py bench --host-overhead``): how long the CPU spends in one norm call of
infiniop_py.torch against stock torch's, on tensors so small that the kernels take next to nothing, so what is
timed is the Python, dispatch and launch work around them. On CUDA the call is not synchronized: a call's host
time is the time until it returns, with the queue emptied (torch.cuda.synchronize) only between timed batches.

Each row times one call of stock torch's and ours in alternation, in rounds (bench/timing.py's balanced_orders
decides who goes first, so that each follows the other equally often); every call is timed on its own and the
medians are reported, with their ratio:

- forward: module(x) with x requiring grad (autograd records the graph, as in training);
- forward (no_grad): the same under torch.no_grad (a validation pass, inference), the module still in training
  mode (BatchNorm: batch statistics, running ones updated);
- forward + backward: module(x).backward(grad) (the parameters' and x's .grad reset to None before each call,
  on both sides alike);
- functional: the backward kernel call alone, on saved statistics: torch's own aten op
  (_fused_rms_norm_backward where the device has it, else the autograd backward of rms_norm, as on the CPU;
  native_layer_norm_backward, native_batch_norm_backward) against
  infiniop_py.rms_norm_backward / layer_norm_backward / batch_norm_backward on the same device tensors, each
  allocating its outputs;
- functional (DeviceArray): the same, ours on DeviceArrays holding the same data in the same layouts (the path of
  arrays from other libraries, which arrive through DLPack or __cuda_array_interface__ and get DeviceArray
  outputs), against the same torch op on torch tensors.

Modules and data are in the row's dtype throughout (pure BF16: torch 2.11 refuses BF16 data with F32
parameters in LayerNorm on CUDA).
"""

import statistics
import time

from .nvidia import _torch_rms_norm_backward
from .timing import balanced_orders, machine_description

DTYPES = ("float32", "bfloat16")
CHANNELS, ROWS, WIDTH = 4, 2, 8
CALLS = 10  # timed calls of each side per round, between two synchronizations
# Rounds per --repeats: short batches in many rounds, so that a stall of a shared machine (on the project's 2-core
# VM, batches of 50 calls took 16-44 ms per call while other jobs ran) hits both sides alike, not one side's median.
ROUNDS_PER_REPEAT = 5
# (name, torch.nn class name, shape of x, layout): rows (2, 8); images of 4 channels, 2 per spatial dim
CASES = (
    ("RMSNorm", "RMSNorm", (ROWS, WIDTH), "rows"),
    ("LayerNorm", "LayerNorm", (ROWS, WIDTH), "rows"),
    ("BatchNorm1d", "BatchNorm1d", (2, CHANNELS, 2), "channels-first"),
    ("BatchNorm1d", "BatchNorm1d", (2, CHANNELS, 2), "channels-last"),
    ("BatchNorm2d", "BatchNorm2d", (2, CHANNELS, 2, 2), "channels-first"),
    ("BatchNorm2d", "BatchNorm2d", (2, CHANNELS, 2, 2), "channels-last"),
    ("BatchNorm3d", "BatchNorm3d", (2, CHANNELS, 2, 2, 2), "channels-first"),
    ("BatchNorm3d", "BatchNorm3d", (2, CHANNELS, 2, 2, 2), "channels-last"),
)
MODES = ("forward", "forward (no_grad)", "forward+backward", "functional", "functional (DeviceArray)")


def _laid_out(torch, tensor, layout):
    """``tensor`` (N, C, *spatial) with C innermost where ``layout`` is channels-last, else as it is."""
    if layout != "channels-last":
        return tensor
    return tensor.movedim(1, -1).contiguous().movedim(-1, 1)


def _module(torch, class_name, shape, dtype, device, ours):
    import infiniop_py.torch as ipt

    size = shape[-1] if class_name in ("RMSNorm", "LayerNorm") else shape[1]
    module = getattr(ipt if ours else torch.nn, class_name)(size).to(device, dtype)
    with torch.no_grad():
        for parameter in module.parameters():  # not all ones and zeros, as a trained model's
            parameter.uniform_(0.5, 1.5)
    return module


def _module_runs(torch, class_name, shape, layout, dtype, device, mode):
    """(stock, ours): callables of one forward, or one forward + backward, of each side's module."""
    generator = torch.Generator(device="cpu").manual_seed(0)
    data = torch.randn(shape, generator=generator).to(device, dtype)
    x = _laid_out(torch, data, layout).requires_grad_()
    grad = _laid_out(torch, torch.randn(shape, generator=generator).to(device, dtype), layout)

    def run_of(module):
        parameters = list(module.parameters())
        if mode == "forward":
            return lambda: module(x)
        if mode == "forward (no_grad)":
            def unrecorded():
                with torch.no_grad():
                    module(x)
            return unrecorded

        def step():
            for parameter in parameters:
                parameter.grad = None
            x.grad = None
            module(x).backward(grad)
        return step

    return (run_of(_module(torch, class_name, shape, dtype, device, ours=False)),
            run_of(_module(torch, class_name, shape, dtype, device, ours=True)))


def _device_array(torch, tensor):
    """A DeviceArray with ``tensor``'s data, dtype and (dense) layout, on the same device."""
    import infiniop_py
    from infiniop_py._ffi import ffi, libraries

    from .cpu import _numpy_dtype

    host = tensor.detach().cpu()  # keeps a dense layout's strides
    dtype = _numpy_dtype(str(tensor.dtype).replace("torch.", ""))  # as tensors.py names a torch dtype
    array = infiniop_py.DeviceArray(tuple(host.shape), dtype, "nvidia" if tensor.is_cuda else "cpu",
                                    tensor.device.index or 0, host.stride())
    array.buffer._copy(array.buffer._open_pointer(), ffi.cast("void *", host.data_ptr()),
                       libraries().rt.INFINIRT_MEMCPY_H2D)
    return array


def _functional_runs(torch, class_name, shape, layout, dtype, device, device_arrays=False):
    """(stock, ours, what stock calls): torch's own backward op against this library's functional call, on the
    statistics that torch's forward saved for the same data; ``device_arrays``: ours on DeviceArrays of it."""
    import infiniop_py

    mine = (lambda tensor: _device_array(torch, tensor)) if device_arrays else (lambda tensor: tensor)
    aten = torch.ops.aten
    generator = torch.Generator(device="cpu").manual_seed(0)

    def random(*size):
        return torch.randn(size, generator=generator).to(device, dtype)

    x, grad = _laid_out(torch, random(*shape), layout), _laid_out(torch, random(*shape), layout)
    if class_name == "RMSNorm":
        weight = random(shape[-1])
        # torch's fused backward where the device has one (CUDA), else the autograd backward of rms_norm (the CPU)
        stock, method = _torch_rms_norm_backward(torch, grad, x, weight)
        rstd_rows = (x.float().square().mean(-1) + 0.0).rsqrt()  # eps 0, as _torch_rms_norm_backward's
        arrays = [mine(tensor) for tensor in (grad, x, weight, rstd_rows)]
        return stock, lambda: infiniop_py.rms_norm_backward(*arrays[:3], rstd=arrays[3]), method
    if class_name == "LayerNorm":
        weight, bias, normalized = random(shape[-1]), random(shape[-1]), [shape[-1]]
        _, mean, rstd = aten.native_layer_norm(x, normalized, weight, bias, 1e-5)
        mean_rows, rstd_rows = mean.reshape(shape[:-1]).float(), rstd.reshape(shape[:-1]).float()
        ours_grad, ours_weight, ours_x, ours_mean, ours_rstd = map(mine, (grad, weight, x, mean_rows, rstd_rows))
        return (lambda: aten.native_layer_norm_backward(grad, x, normalized, mean, rstd, weight, bias,
                                                        [True, True, True]),
                lambda: infiniop_py.layer_norm_backward(ours_grad, ours_weight, input=ours_x, mean=ours_mean,
                                                        rstd=ours_rstd),
                "native_layer_norm_backward")
    weight, bias = random(shape[1]), random(shape[1])
    _, save_mean, save_invstd = aten.native_batch_norm(x, weight, bias, None, None, True, 0.1, 1e-5)
    mean32, invstd32 = save_mean.float(), save_invstd.float()  # 16-bit parameters: torch saves 16-bit statistics
    ours_x, ours_grad, ours_weight, ours_mean, ours_invstd = map(mine, (x, grad, weight, mean32, invstd32))
    return (lambda: aten.native_batch_norm_backward(grad, x, weight, None, None, save_mean, save_invstd, True, 1e-5,
                                                    [True, True, True]),
            lambda: infiniop_py.batch_norm_backward(ours_x, ours_grad, ours_weight, None, None, eps=1e-5,
                                                    save_mean=ours_mean, save_invstd=ours_invstd, training=True),
            "native_batch_norm_backward")


def host_medians(runs, rounds, calls, synchronize):
    """Median seconds per call of each callable in ``runs``: in each round each runs (in balanced_orders' order)
    once untimed, then ``calls`` times, each call timed on its own; ``synchronize()`` before the untimed call and
    before the timed ones, never between them."""
    times = [[] for _ in runs]
    orders = balanced_orders(len(runs))
    clock = time.perf_counter
    for round_index in range(max(rounds, 1)):
        for index in orders[round_index % len(orders)]:
            run, own = runs[index], times[index]
            synchronize()
            run()
            synchronize()
            for _ in range(calls):
                begin = clock()
                run()
                own.append(clock() - begin)
    return [statistics.median(own) for own in times]


def run(repeats=7, dtypes=DTYPES, device="cpu", calls=None):
    """The report; ``device``: a torch device ("cpu", "cuda:0"). It times this library's path: on the CPU the drop-ins
    give tensors this small to torch's own norms end to end (infiniop_py.torch.functional._TORCH_BELOW), which is
    set aside meanwhile."""
    from infiniop_py.torch import functional

    sizes, functional._TORCH_BELOW = functional._TORCH_BELOW, {}
    try:
        return _run(repeats, dtypes, device, calls)
    finally:
        functional._TORCH_BELOW = sizes


def _run(repeats, dtypes, device, calls):
    import torch

    device = torch.device(device)
    calls = CALLS if calls is None else calls
    rounds = ROUNDS_PER_REPEAT * repeats
    if device.type == "cuda":
        from .nvidia import gpu_description
        torch.cuda.set_device(device)
        machine = f"{machine_description()}; {gpu_description(torch, device)}"
        synchronize = lambda: torch.cuda.synchronize(device)  # noqa: E731
    else:
        machine = machine_description()
        synchronize = lambda: None  # noqa: E731
    report = {"machine": machine, "device": str(device), "threads": torch.get_num_threads(),
              "torch_version": torch.__version__, "calls_per_round": calls, "rounds": rounds, "results": []}
    for mode in MODES:
        for name, class_name, shape, layout in CASES:
            for dtype_name in dtypes:
                dtype = getattr(torch, dtype_name)
                if mode.startswith("functional"):
                    *runs, method = _functional_runs(torch, class_name, shape, layout, dtype, device,
                                                     device_arrays=mode != "functional")
                else:
                    runs = _module_runs(torch, class_name, shape, layout, dtype, device, mode)
                    method = f"torch.nn.{class_name}"
                stock_s, ours_s = host_medians(runs, rounds, calls, synchronize)
                report["results"].append({"mode": mode, "op": name, "layout": layout, "dtype": dtype_name,
                                          "shape": list(shape), "stock": method, "stock_s": stock_s, "ours_s": ours_s,
                                          "ratio": ours_s / stock_s})
    return report


def format_table(report):
    lines = [f"machine: {report['machine']}; device: {report['device']}; threads: {report['threads']}; "
             f"torch {report['torch_version']}",
             f"host time per call (until the call returns; CUDA: not synchronized), median over "
             f"{report['rounds']} rounds x {report['calls_per_round']} calls of each side, stock torch and ours in "
             f"alternation", ""]
    lines += ["| mode | op | dtype | layout | shape | stock us | ours us | ours/stock |",
              "|---|---|---|---|---|---:|---:|---:|"]
    for r in report["results"]:
        shape = "x".join(map(str, r["shape"]))
        lines.append(f"| {r['mode']} | {r['op']} | {r['dtype']} | {r['layout']} | {shape} | {r['stock_s'] * 1e6:.1f} "
                     f"| {r['ours_s'] * 1e6:.1f} | {r['ratio']:.2f}x |")
    methods = {r["op"]: r["stock"] for r in report["results"] if r["mode"] == "functional"}
    lines += ["", "functional, stock: " + "; ".join(f"{op}: {method}" for op, method in methods.items())]
    worst = max(report["results"], key=lambda r: r["ratio"])
    lines += [f"worst: {worst['mode']} {worst['op']} {worst['dtype']} {worst['layout']} at {worst['ratio']:.2f}x "
                  f"stock (the goal: at most 1.2x)"]
    return "\n".join(lines)
