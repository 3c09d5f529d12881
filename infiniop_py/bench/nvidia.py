"""GPU benchmark (``bench --device nvidia``): our operators vs PyTorch CUDA, Liger-Kernel (RMSNorm, LayerNorm) and
cuDNN (BatchNorm) on the same device tensors, against a device-to-device copy measured in the same run.

Every implementation is captured in a CUDA graph of GRAPH_CALLS back-to-back calls on one stream and timed by
replaying it between CUDA events, so launch cost counts for none of them; the copy is timed eagerly, as a user
runs it. PyTorch runs its fused backward kernels (LayerNorm ``native_layer_norm_backward``, BatchNorm
``native_batch_norm_backward``, RMSNorm ``_fused_rms_norm_backward``, or the autograd backward of ``rms_norm``
where that has no kernel), fed with the statistics of its own forward on the same data; the peers
(gpu_peers.py) with their own forwards' statistics. Ours is the bare C call of an operator object made once.
"""

import statistics

from . import cpu
from . import gpu_peers
from . import timing

# Issue 53's shapes: rows of 512-16384 that fill a GPU, and one row of 1M elements (split across SMs).
ROW_SHAPES = [(4096, 4096), (16384, 4096), (8192, 8192), (2048, 16384), (65536, 1024), (32768, 512), (1, 1 << 20)]
# BatchNorm (N, C, H, W): channels-first ones of issue 53's table, then ResNet-50's at batch 128 (the stem's,
# and each stage's widest), channels-last as a channels_last model trains.
BATCH_SHAPES = ([((256, 64, 56, 56), "channels_first"), ((32, 256, 32, 32), "channels_first"),
                 ((128, 512, 7, 7), "channels_first")]
                + [(shape, "channels_last") for shape in ((128, 64, 112, 112), (128, 256, 56, 56), (128, 512, 28, 28),
                                                          (128, 1024, 14, 14), (128, 2048, 7, 7))])
COPY_BYTES = 1 << 29  # 512 MiB: far beyond any GPU's L2
LAYER_NORM_EPS = 1e-5
BATCH_NORM_EPS = 1e-5  # cuDNN's least
GRAPH_CALLS = 10
# Result key -> column label of each peer, in the table's order.
PEERS = {"liger_s": "Liger", "cudnn_s": "cuDNN"}


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


class TimedCase:
    """What a case of either direction has: ``ours()``, our operator's bare C call on its tensors (bind), each
    peer's (call, output) or the reason it cannot run (peer), ``outputs()`` and ``close()``."""

    def bind(self, torch, operator, tensors, device, stream):
        """Our call: ``operator`` on ``tensors`` (its arguments in order, None where absent) and a workspace of its
        size, on ``stream`` (None: the default stream). Returns the workspace."""
        self.operator, self._tensors = operator, tensors
        workspace = torch.empty(max(operator.workspace_size, 1), dtype=torch.uint8, device=device)
        self._workspace = workspace
        stream_address = 0 if stream is None else stream.cuda_stream
        self.ours = timing.native_call(operator, [0 if t is None else t.data_ptr() for t in tensors],
                                       workspace.data_ptr(), stream_address)
        return workspace

    def peer(self, key, build):
        try:
            self.peers[key] = build()
        except gpu_peers.Unavailable as why:
            self.peers[key] = str(why)

    def outputs(self):
        """{"ours": our main output (a backward's grad_input, a forward's y), "torch": torch's, peer key: the
        peer's}, after a run of each."""
        self.ours()
        results = {"ours": self._tensors[0], "torch": self.theirs()[0]}
        for key, peer in self.peers.items():
            if not isinstance(peer, str):
                results[key] = peer[1]()
        return results

    def close(self):
        self.operator.close()


class GpuCase(TimedCase):
    """One case on one torch device: ``ours()``, ``theirs()`` and each available peer's call launch on the current
    stream (ours on ``stream``, which must then be current) and return nothing; ``outputs()`` gives the main
    gradients of each, to check that all computed the same thing. ``peers``: result key -> (call, gradient) or
    the reason it cannot run, for the peers asked for: ``liger`` (gpu_peers.liger_modules()) for the row norms,
    ``cudnn`` for BatchNorm."""

    def __init__(self, torch, op, dtype, shape, handle, device, generator, layout="channels_first", stream=None,
                 liger=None, cudnn=False):
        import infiniop_py as ip

        self.op, self.dtype, self.shape, self.layout = op, dtype, tuple(shape), layout
        self.direction = "backward"
        dt = cpu.torch_dtype(torch, dtype)
        self.bytes_moved = cpu.bytes_moved(dtype, shape)
        self.parameter_dtype = dtype
        self.peers = {}
        self.phases = {}  # BatchNorm: result key -> our two-phase API's call of that phase (sums, then grad_input)

        def random(*size):
            return torch.randn(size, generator=generator, device=device, dtype=torch.float32).to(dt)

        aten = torch.ops.aten
        if op == "rms_norm":
            grad_y, x, w = random(*shape), random(*shape), random(shape[-1])
            tensors = [torch.empty_like(grad_y), torch.empty_like(w), grad_y, x, w]
            operator_class = ip.RMSNormBackward
            self.theirs, self.torch_method = _torch_rms_norm_backward(torch, grad_y, x, w)
            if liger is not None:
                self.peer("liger_s", lambda: gpu_peers.liger_rms_norm_backward(liger, grad_y, x, w))
        elif op in ("layer_norm", "layer_norm_from_input"):
            x32 = torch.randn(shape, generator=generator, device=device)
            mean = x32.mean(-1, keepdim=True)
            std = (x32.var(-1, unbiased=False, keepdim=True) + LAYER_NORM_EPS).sqrt()
            grad_output, weight, x = random(*shape), random(shape[-1]), x32.to(dt)
            outputs = [torch.empty_like(grad_output), torch.empty_like(weight), torch.empty_like(weight)]
            if op == "layer_norm":  # the seed's form: xhat and std
                xhat, std_dev = ((x32 - mean) / std).to(dt), std[..., 0].to(dt)
                tensors = outputs + [grad_output, weight, xhat, std_dev]
                operator_class = ip.LayerNormBackward
            else:  # torch's form: the forward's input, F32 mean and rstd
                tensors = outputs + [grad_output, weight, x, mean[..., 0].contiguous(), (1 / std[..., 0]).contiguous()]
                operator_class = ip.LayerNormBackwardFromInput
            _, saved_mean, saved_rstd = aten.native_layer_norm(x, list(shape[-1:]), weight, weight, LAYER_NORM_EPS)
            self.theirs = lambda: aten.native_layer_norm_backward(  # noqa: E731
                grad_output, x, list(shape[-1:]), saved_mean, saved_rstd, weight, weight, [True, True, True])
            self.torch_method = "native_layer_norm_backward"
            if liger is not None:
                self.peer("liger_s", lambda: gpu_peers.liger_layer_norm_backward(liger, grad_output, x, weight,
                                                                                  LAYER_NORM_EPS))
        else:
            # Training with saved statistics; F32 parameters for 16-bit data, as autocast trains (and cuDNN needs).
            memory_format = torch.channels_last if layout == "channels_last" else torch.contiguous_format
            x = random(*shape).contiguous(memory_format=memory_format)
            grad_output = random(*shape).contiguous(memory_format=memory_format)
            weight = torch.randn(shape[1], generator=generator, device=device)
            self.parameter_dtype = "float32"
            _, save_mean, save_invstd = aten.native_batch_norm(x, weight, weight, None, None, True, 0.0,
                                                               BATCH_NORM_EPS)
            tensors = [torch.empty_like(x), torch.empty_like(weight), torch.empty_like(weight),
                       x, grad_output, weight, None, None, save_mean, save_invstd]
            operator_class = ip.BatchNormBackward
            self.theirs = lambda: aten.native_batch_norm_backward(  # noqa: E731
                grad_output, x, weight, None, None, save_mean, save_invstd, True, BATCH_NORM_EPS, [True, True, True])
            self.torch_method = "native_batch_norm_backward"
            if cudnn:
                self.peer("cudnn_s", lambda: gpu_peers.cudnn_batch_norm_backward(torch, x, grad_output, weight,
                                                                                  BATCH_NORM_EPS))
        options = {"eps": BATCH_NORM_EPS} if op == "batch_norm" else {}
        workspace = self.bind(torch, operator_class(handle, *tensors, **options), tensors, device, stream)
        if op == "batch_norm":
            self._phase_calls(torch, workspace, stream)

    def _phase_calls(self, torch, workspace, stream):
        """Where a BatchNorm call's time goes: its reduce phase (the per-channel sums, grad_weight, grad_bias:
        kernels 1 and 2 of the one call) and its elementwise phase (grad_input: kernel 3), each timed alone."""
        grad_input, grad_weight, grad_bias, x, grad_output, weight, _, _, save_mean, save_invstd = self._tensors
        sums = [torch.empty_like(save_mean) for _ in range(2)]
        count = x.numel() // x.shape[1]
        operator = self.operator
        self.phases["ours_reduce_s"] = lambda: operator.reduce(  # noqa: E731
            *sums, grad_weight, grad_bias, x, grad_output, None, None, save_mean, save_invstd, workspace=workspace,
            stream=stream)
        self.phases["ours_elementwise_s"] = lambda: operator.elementwise(  # noqa: E731
            grad_input, x, grad_output, weight, None, None, save_mean, save_invstd, *sums, count,
            workspace=workspace, stream=stream)

def relative_difference(value, reference):
    """max |value - reference| / max |reference|, in F32."""
    return float((value.float() - reference.float()).abs().max() / reference.float().abs().max().clamp_min(1e-30))


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
    """Median GPU time of one eager run(): batches of back-to-back calls between two CUDA events on the current
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


def graph_seconds(torch, run, stream, replays=20, calls=GRAPH_CALLS):
    """Median GPU time of one run(): a CUDA graph of ``calls`` runs captured on ``stream`` (after eager warm-up
    runs, which compile Triton kernels and make cuDNN's plans), its replays timed between CUDA events."""
    with torch.cuda.stream(stream):
        for _ in range(3):
            run()
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(calls):
            run()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    with torch.cuda.stream(stream):
        graph.replay()  # the first replay uploads the graph
        for _ in range(replays):
            start.record(stream)
            graph.replay()
            end.record(stream)
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3 / calls)
    del graph
    return statistics.median(times)


def copy_bandwidth(torch, device, batches):
    """Device-to-device copy of COPY_BYTES with torch, eagerly, in bytes/s (read + write counted)."""
    source = torch.empty(COPY_BYTES, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    return 2 * COPY_BYTES / event_seconds(torch, lambda: target.copy_(source), batches)


def gpu_description(torch, device):
    properties = torch.cuda.get_device_properties(device)
    return (f"{properties.name} ({properties.total_memory / 2**30:.0f} GiB, {properties.multi_processor_count} SMs, "
            f"sm_{properties.major}{properties.minor}), CUDA {torch.version.cuda}")


def cases(ops, dtypes, quick):
    """(op, dtype, shape, layout) of each case: per op, per dtype, its shapes (the first only when quick)."""
    for op in ops:
        shapes = BATCH_SHAPES if op == "batch_norm" else [(shape, "rows") for shape in ROW_SHAPES]
        for dtype in dtypes:
            for shape, layout in shapes[:1] if quick else shapes:
                yield op, dtype, shape, layout


def peer_columns(ops, liger_name, cudnn_name):
    """(peers, versions, notes) of the report: the peers that can run some op asked for, as PEERS' (key, label)
    pairs, their versions, and why a peer that would apply has no column. A name is a version, or the
    Unavailable reason where that peer cannot run at all."""
    wanted = {"liger_s": any(op != "batch_norm" for op in ops), "cudnn_s": "batch_norm" in ops}
    peers, versions, notes = [], [], []
    for key, name in (("liger_s", liger_name), ("cudnn_s", cudnn_name)):
        if not wanted[key]:
            continue
        if isinstance(name, gpu_peers.Unavailable):
            notes.append(f"no {PEERS[key]} column: {name}")
        else:
            peers.append([key, PEERS[key]])
            versions.append(name)
    return peers, versions, notes


def case_row(case, times, differences):
    """A case's JSON row: times (key -> seconds or None) of ours, torch's and each peer's; their main outputs'
    (a backward's grad_input, a forward's y) largest relative difference to torch's."""
    row = {"op": case.op, "direction": case.direction, "dtype": case.dtype, "shape": list(case.shape),
           "ours_s": times["ours_s"], "torch_s": times["torch_s"],
           "ours_bandwidth": case.bytes_moved / times["ours_s"], "torch_bandwidth": case.bytes_moved / times["torch_s"],
           "torch_method": case.torch_method,
           "max_relative_difference_vs_torch": differences["ours"]}
    if case.op == "batch_norm":
        row.update(layout=case.layout, parameter_dtype=case.parameter_dtype)
    for key in PEERS:
        if key in case.peers:
            row[key] = times.get(key)
            row[f"{key[:-2]}_max_relative_difference_vs_torch"] = differences.get(key)
    for key in case.phases:
        row[key] = times.get(key)
    return row


def phase_note(row, copy_bandwidth):
    """The note on where a BatchNorm row's time goes (None for other rows, or where a phase was not timed): each
    phase's ms and fraction of copy bandwidth (the sums read input and grad_output, grad_input also writes), and
    what the one call costs beyond the two (launch gaps, the finalize kernel's share)."""
    reduce_s, elementwise_s = row.get("ours_reduce_s"), row.get("ours_elementwise_s")
    if reduce_s is None or elementwise_s is None:
        return None
    moved = row["ours_bandwidth"] * row["ours_s"]  # read input and grad_output, write grad_input
    label = f"{row['op']} {row['dtype']} {cpu.shape_label(row)}"
    return (f"{label}: ours {row['ours_s'] * 1e3:.4f} ms = reduce {reduce_s * 1e3:.4f} ms "
            f"({moved * 2 / 3 / reduce_s / copy_bandwidth:.2f} of copy) + elementwise {elementwise_s * 1e3:.4f} ms "
            f"({moved / elementwise_s / copy_bandwidth:.2f} of copy) "
            f"{(row['ours_s'] - reduce_s - elementwise_s) * 1e3:+.4f} ms")


def _run_case(torch, case, stream, replays, notes):
    """(times, differences) of one case; a peer that fails in its run or its capture is noted and left out."""
    label = f"{case.op} {case.dtype} {cpu.shape_label({'shape': case.shape, 'layout': case.layout})}"
    calls = {"ours_s": case.ours, "torch_s": case.theirs}
    for key, peer in case.peers.items():
        if isinstance(peer, str):
            notes.append(f"no {PEERS[key]} time for {label}: {peer}")
        else:
            calls[key] = peer[0]
    times = {}
    for key, call in case.phases.items():  # where our time goes: notes, no column
        try:
            times[key] = graph_seconds(torch, call, stream, replays)
        except Exception as error:
            notes.append(f"{label}: {key[:-2]} not timed ({(str(error) or type(error).__name__).splitlines()[0]})")
    for key, call in calls.items():
        try:
            times[key] = graph_seconds(torch, call, stream, replays)
        except Exception as error:  # a failed capture is one case's note, not the end of the whole run
            reason = (str(error) or type(error).__name__).splitlines()[0]
            if key in ("ours_s", "torch_s"):  # the row needs both: timed eagerly instead
                notes.append(f"{label}: {key[:-2]} not captured in a CUDA graph ({reason}); timed eagerly")
                times[key] = event_seconds(torch, call, replays)
            else:
                notes.append(f"no {PEERS[key]} time for {label}: {reason}")
                case.peers[key] = reason
    outputs = case.outputs()  # on the current stream, as the differences after it
    differences = {key: relative_difference(value, outputs["torch"]) for key, value in outputs.items()
                   if key != "torch"}
    return times, differences


def run(args):
    """The report of cpu.format_table for NVIDIA device ``args.device_id`` (Unavailable if it cannot run): the
    backwards, or with ``args.forward`` the forwards (nvidia_forward.py)."""
    import infiniop_py as ip

    direction = "forward" if getattr(args, "forward", False) else "backward"
    if direction == "forward":
        from .nvidia_forward import GpuForwardCase as case_class
    else:
        case_class = GpuCase

    torch = require_cuda(args.device_id)
    device = f"cuda:{args.device_id}"
    torch.cuda.set_device(device)
    replays = max(args.repeats, 20)
    copy = copy_bandwidth(torch, device, replays)
    generator = torch.Generator(device=device).manual_seed(0)
    planned = list(cases(args.ops, args.dtypes, args.quick))
    liger, liger_name = None, None
    try:
        *liger, liger_name = gpu_peers.liger_modules()
    except gpu_peers.Unavailable as why:
        liger, liger_name = None, why
    try:
        cudnn_name = gpu_peers.cudnn_version(torch)
    except gpu_peers.Unavailable as why:
        cudnn_name = why
    peers, versions, notes = peer_columns(args.ops, liger_name, cudnn_name)
    stream = torch.cuda.Stream(device)
    results = []
    with ip.Handle("nvidia", args.device_id) as handle, torch.cuda.stream(stream):
        for index, (op, dtype, shape, layout) in enumerate(planned):
            timing.progress(index, len(planned), f"{op} {dtype} {shape}")
            case = case_class(torch, op, dtype, shape, handle, device, generator, layout, stream, liger,
                              cudnn=not isinstance(cudnn_name, gpu_peers.Unavailable))
            try:
                times, differences = _run_case(torch, case, stream, replays, notes)
            finally:
                case.close()
            results.append(case_row(case, times, differences))
            note = phase_note(results[-1], copy)
            if note is not None:
                notes.append(note)
            del case
            torch.cuda.empty_cache()  # the next case's graphs and tensors start from a clean pool
        timing.progress(len(planned), len(planned), "done")
    return {
        "machine": gpu_description(torch, device), "threads": None, "direction": direction, "copy_bandwidth": copy,
        "copy_method": "torch copy_ of 512 MiB, device to device, eager, same run",
        "timing_method": f"CUDA graph of {GRAPH_CALLS} calls on one stream, median of {replays} replays",
        "torch_version": torch.__version__, "functional_overhead_s": None,
        "peers": peers, "peer_versions": versions, "peer_notes": notes, "results": results,
    }
