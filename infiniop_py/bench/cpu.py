"""The CPU benchmark: our operators vs PyTorch (and oneDNN, where it is installed) on the same data and threads,
against a copy measured in the same run, and its table and plot.

Effective bandwidth = 3 x elements x itemsize / time (read two row-sized inputs, write one output; the
O(D) vectors are left out), reported as a fraction of the copy bandwidth. Times are medians. On the CPU the
copy, our op and torch's op are timed in interleaved rounds (each call timed right after two untimed calls of
itself), and each case is set against its own rounds' copy: a shared machine's memory bandwidth drifts from
minute to minute, and one copy timed at the start would put that drift into every fraction. The run goes over
all cases several times (visits, each on freshly allocated data) and reports each time as the median over the
visits: a neighbour's burst that slows one visit of a case then does not decide its row.
"""

import contextlib
import os
import statistics

import numpy as np

from .. import _host_memory
from . import onednn
from .timing import interleaved_medians, machine_description, median_seconds, native_call, progress

ROW_SHAPES = [(4096, 4096), (32768, 512), (256, 65536), (1, 1048576)]
BATCH_SHAPES = [(32, 256, 1024), (256, 64, 4096), (8192, 64, 16), (4, 2, 1048576)]
# `--shapes llm`: mid-size shapes of LLM training on a CPU (tokens x hidden) and of BatchNorm: CNN stages (late, 7x7
# maps of thousands of channels; early, 56x56 of 64) and an MLP's BatchNorm1d (a batch of 256 rows of 4096).
LLM_ROW_SHAPES = [(16, 4096), (64, 4096), (512, 4096), (8192, 768), (8192, 1024)]
LLM_BATCH_SHAPES = [(64, 512, 49), (32, 2048, 49), (256, 64, 56 * 56), (256, 4096, 1)]
# `--shapes short`: a million elements in short rows, the features of small models (tabular MLPs, graph and
# point-cloud networks, small transformers), and BatchNorm1d over as few features.
SHORT_ROW_SHAPES = [(65536, 16), (16384, 64), (8192, 128), (4096, 256)]
SHORT_BATCH_SHAPES = [(65536, 16, 1), (16384, 64, 1)]
SHAPE_SETS = ("table", "llm", "short")


def shapes_of(name):
    """(row shapes, batch shapes) of `--shapes name`, looked up when called."""
    return {"table": (ROW_SHAPES, BATCH_SHAPES), "llm": (LLM_ROW_SHAPES, LLM_BATCH_SHAPES),
            "short": (SHORT_ROW_SHAPES, SHORT_BATCH_SHAPES)}[name]
DTYPES = ["float32", "bfloat16", "float16"]
COPY_BYTES = 256 << 20  # far beyond every cache


def copy_call(torch):
    """(a call that copies COPY_BYTES, its name): torch's copy_ where torch is present, numpy's copyto otherwise.
    torch's copies with the benchmark's threads (torch.set_num_threads), numpy's with one, so where both exist
    torch's is the one that can reach the memory bandwidth the operators have."""
    source = np.ones(COPY_BYTES // 4, dtype=np.float32)
    target = np.empty_like(source)
    if torch is None:
        return (lambda: np.copyto(target, source)), "numpy copyto"
    source_t, target_t = torch.from_numpy(source), torch.from_numpy(target)
    return (lambda: target_t.copy_(source_t)), "torch copy"


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def _numpy_dtype(name):
    from .. import dtypes
    return dtypes.to_numpy(dtypes.code_of(name))


def bytes_moved(dtype, shape, direction="backward"):
    """The traffic the effective bandwidth counts: two row-sized inputs read, one written (a forward: see
    forward.bytes_moved)."""
    if direction == "forward":
        from . import forward
        return forward.bytes_moved(dtype, shape)
    return 3 * int(np.prod(shape)) * np.dtype(_numpy_dtype(dtype)).itemsize


class Case:
    """One benchmark case: the data, our operator ready to run, and torch's equivalent call."""

    def __init__(self, op, dtype, shape, rng):
        self.op, self.dtype, self.shape = op, dtype, shape
        self._rng = rng
        self.outputs = ()  # build_case's gradient arrays
        self.arrays, self.workspace = (), None  # the operator's arguments in C order, and its workspace

    def random(self, shape):
        return aligned(self._rng.standard_normal(shape, dtype=np.float32).astype(_numpy_dtype(self.dtype)))


def aligned(values):
    """A copy of values at a 64-byte boundary, as torch allocates. numpy's large arrays start 16 bytes into a
    page, which splits every 64-byte vector load across two cache lines; torch runs on these same buffers (see
    _to_torch), so both sides see the same alignment."""
    placed = _host_memory.aligned_empty(values.shape, values.dtype)
    placed[...] = values
    return placed


def build_case(op, dtype, shape, handle, rng, with_onednn=False):
    """(case, operator, run_ours, run_torch or None, oneDNN's Reference or the reason there is none); run_* take no
    arguments. oneDNN runs on the same input, grad_output and statistics, its parameters as F32 copies."""
    import infiniop_py as ip

    case = Case(op, dtype, shape, rng)
    torch = _torch()
    if op == "rms_norm":
        grad_y, x, w = case.random(shape), case.random(shape), case.random(shape[-1:])
        grad_x, grad_w = aligned(np.empty_like(grad_y)), np.empty_like(w)
        operator = ip.RMSNormBackward(handle, grad_x, grad_w, grad_y, x, w)
        arrays = (grad_x, grad_w, grad_y, x, w)
        torch_run = None
        if torch is not None:
            tx, tw = _to_torch(torch, x).requires_grad_(), _to_torch(torch, w).requires_grad_()
            ty = torch.nn.functional.rms_norm(tx, shape[-1:], tw, eps=0.0)
            tgy = _to_torch(torch, grad_y)
            torch_run = lambda: torch.autograd.grad(ty, (tx, tw), tgy, retain_graph=True)  # noqa: E731
        reference = "oneDNN 3.2 has no RMSNorm"
    elif op in ("layer_norm", "layer_norm_from_input"):
        x64 = rng.standard_normal(shape)
        mean, std = x64.mean(-1, keepdims=True), np.sqrt(x64.var(-1, keepdims=True) + 1e-5)
        np_dtype = _numpy_dtype(dtype)
        row_input = aligned(x64.astype(np_dtype))  # the forward's input: ours (from-input form), torch's, oneDNN's
        grad_output, weight = case.random(shape), case.random(shape[-1:])
        grad_input, grad_weight, grad_bias = aligned(np.empty_like(grad_output)), np.empty_like(weight), np.empty_like(weight)
        if op == "layer_norm":  # the seed's form: xhat and std
            xhat, std_dev = aligned(((x64 - mean) / std).astype(np_dtype)), std[..., 0].astype(np_dtype)
            operator = ip.LayerNormBackward(handle, grad_input, grad_weight, grad_bias, grad_output, weight, xhat,
                                            std_dev)
            arrays = (grad_input, grad_weight, grad_bias, grad_output, weight, xhat, std_dev)
        else:  # PyTorch's form: the forward's input, mean and rstd (F32)
            row_mean, row_rstd = mean[..., 0].astype(np.float32), (1 / std[..., 0]).astype(np.float32)
            operator = ip.LayerNormBackwardFromInput(handle, grad_input, grad_weight, grad_bias, grad_output, weight,
                                                     row_input, row_mean, row_rstd)
            arrays = (grad_input, grad_weight, grad_bias, grad_output, weight, row_input, row_mean, row_rstd)
        torch_run = None
        if torch is not None:
            stat_dtype = torch.float32 if dtype == "float32" else torch_dtype(torch, dtype)
            tin = _to_torch(torch, row_input)
            tmean = torch.from_numpy(mean.astype(np.float32)).to(stat_dtype)
            trstd = torch.from_numpy((1 / std).astype(np.float32)).to(stat_dtype)
            tgo, tw = _to_torch(torch, grad_output), _to_torch(torch, weight)
            torch_run = lambda: torch.ops.aten.native_layer_norm_backward(  # noqa: E731
                tgo, tin, list(shape[-1:]), tmean, trstd, tw, tw, [True, True, True])
        reference = _onednn_reference(with_onednn, "layer_norm", dtype, shape, 1e-5, row_input, grad_output,
                                      mean[..., 0], x64.var(-1), weight)
    else:
        x, grad_output, weight = case.random(shape), case.random(shape), case.random(shape[1:2])
        x64 = x.astype(np.float64)
        per_channel = tuple(axis for axis in range(x.ndim) if axis != 1)  # (N, C, *spatial), of any rank
        running_mean = x64.mean(axis=per_channel).astype(x.dtype)
        running_var = x64.var(axis=per_channel).astype(x.dtype)
        grad_input, grad_weight, grad_bias = aligned(np.empty_like(x)), np.empty_like(weight), np.empty_like(weight)
        operator = ip.BatchNormBackward(handle, grad_input, grad_weight, grad_bias, x, grad_output, weight,
                                        running_mean, running_var)
        arrays = (grad_input, grad_weight, grad_bias, x, grad_output, weight, running_mean, running_var)
        torch_run = None
        if torch is not None:
            tx, tgo, tw = _to_torch(torch, x), _to_torch(torch, grad_output), _to_torch(torch, weight)
            tmean = _to_torch(torch, running_mean)
            tinvstd = _to_torch(torch, (1 / np.sqrt(running_var.astype(np.float64))).astype(x.dtype))
            torch_run = lambda: torch.ops.aten.native_batch_norm_backward(  # noqa: E731
                tgo, tx, tw, None, None, tmean, tinvstd, True, 0.0, [True, True, True])
        reference = _onednn_reference(with_onednn, "batch_norm", dtype, shape, 0.0, x, grad_output, running_mean,
                                      running_var, weight)
    case.outputs = arrays[:2] if op == "rms_norm" else arrays[:3]  # the gradients, for comparing builds' bits
    return case, operator, operator_call(case, operator, arrays), torch_run, reference


def operator_call(case, operator, arrays):
    """The operator object's call on arrays with a workspace of its own; keeps both on the case for bare_call."""
    workspace = np.empty(operator.workspace_size, dtype=np.uint8)
    case.arrays, case.workspace = arrays, workspace
    return lambda: operator(*arrays, workspace=workspace)


def bare_call(case, operator):
    """The operator's C run on the case's arrays, without the operator object's Python (5-8 us a call): what oneDNN's
    time is set against, its own call being a bare C call too."""
    return native_call(operator, [0 if a is None else a.ctypes.data for a in case.arrays], case.workspace.ctypes.data)


def _onednn_reference(wanted, kind, dtype, shape, eps, src, diff_dst, mean, variance, weight):
    """oneDNN's primitive on these arrays (statistics and weight as F32 copies, outputs fresh), or why not."""
    if not wanted:
        return "not asked for"
    as_f32 = lambda values: np.ascontiguousarray(np.asarray(values, dtype=np.float32))  # noqa: E731
    channels = shape[1] if kind == "batch_norm" else shape[-1]
    try:
        return onednn.Reference(kind, dtype, shape, eps, src, diff_dst, as_f32(mean), as_f32(variance),
                                as_f32(weight), aligned(np.empty_like(diff_dst)), np.empty(channels, np.float32),
                                np.empty(channels, np.float32))
    except onednn.Unavailable as why:
        return str(why)


def torch_dtype(torch, name):
    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[name]


def _to_torch(torch, array):
    """A torch tensor on the same memory (numpy cannot hand bfloat16 over, so its bits go as int16)."""
    array = np.ascontiguousarray(array)
    if str(array.dtype) == "bfloat16":
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def cases(ops, dtypes_, quick, shape_set="table"):
    row_shapes, batch_shapes = shapes_of(shape_set)
    for op in ops:
        shapes = batch_shapes if op == "batch_norm" else row_shapes
        if quick:
            shapes = shapes[:1]
        for dtype in dtypes_:
            for shape in shapes:
                yield op, dtype, shape


def run(args):
    import infiniop_py as ip

    threads = int(os.environ.get("OMP_NUM_THREADS", os.cpu_count() or 1))
    direction = "forward" if getattr(args, "forward", False) else "backward"
    if direction == "forward":
        from . import forward
        builder = forward.build_case
    else:
        builder = build_case
    torch = _torch()
    if torch is not None:
        torch.set_num_threads(threads)
    copy, copy_name = copy_call(torch)
    planned = list(cases(args.ops, args.dtypes, args.quick, args.shapes))
    with_onednn, onednn_name = onednn.available() if args.onednn else (False, "--no-onednn")
    visits = [[] for _ in planned]  # per case, one {copy_s, ours_s, torch_s, onednn_s} per visit
    onednn_notes = {}  # why a case has no oneDNN time
    steps = args.visits * len(planned)
    with ip.Handle(args.device) as handle:
        for visit in range(args.visits):
            for index, (op, dtype, shape) in enumerate(planned):
                progress(visit * len(planned) + index, steps, f"visit {visit + 1}: {op} {dtype} {shape}")
                # The same data in every visit (seeded by case), in fresh allocations.
                case, operator, ours, theirs, reference = builder(op, dtype, shape, handle,
                                                                  np.random.default_rng(index), with_onednn)
                # oneDNN's call is a bare C call: ours is timed so too beside it (ours_native_s)
                others = {"torch_s": theirs, "onednn_s": reference if callable(reference) else None,
                          "ours_native_s": bare_call(case, operator) if callable(reference) else None}
                if not callable(reference):
                    onednn_notes[(op, dtype)] = reference
                with operator:
                    timed = [name for name, call in others.items() if call is not None]
                    copy_s, ours_s, *times = interleaved_medians([copy, ours] + [others[n] for n in timed],
                                                                 args.repeats)
                row = {"copy_s": copy_s, "ours_s": ours_s, "torch_s": None, "onednn_s": None, "ours_native_s": None}
                row.update(zip(timed, times))
                visits[index].append(row)
                if callable(reference):
                    reference.close()
                del case, operator, ours, theirs, reference  # before the next case allocates its own
        progress(steps, steps, "done")
    results = [case_result(op, dtype, shape, own, direction) for (op, dtype, shape), own in zip(planned, visits)]
    overheads = python_overheads(args.repeats)
    return {
        "machine": machine_description(), "threads": threads, "direction": direction,
        "copy_bandwidth": statistics.median(r["copy_bandwidth"] for r in results),
        "copy_method": (f"{copy_name} of {COPY_BYTES >> 20} MiB, interleaved with each case; "
                        f"median over {args.visits} visits, then over cases"),
        "visits": args.visits,
        "torch_version": torch.__version__ if torch is not None else None,
        "onednn": onednn_name if with_onednn else None, "onednn_unavailable": None if with_onednn else onednn_name,
        "onednn_notes": sorted({f"{op} {dtype}: {why}" for (op, dtype), why in onednn_notes.items()
                                if with_onednn and op != "rms_norm"}),
        "functional_overhead_s": overheads["functional"]["rms_norm"],
        "functional_overheads_s": overheads["functional"], "operator_overheads_s": overheads["operator"],
        "results": results,
    }


def case_result(op, dtype, shape, visits, direction="backward"):
    """A case's row: each time the median over its visits (each visit's own a median of its rounds)."""
    moved = bytes_moved(dtype, shape, direction)
    median_of = lambda key: statistics.median(v[key] for v in visits)  # noqa: E731
    ours_s, copy_s = median_of("ours_s"), median_of("copy_s")
    torch_s = median_of("torch_s") if all(v["torch_s"] for v in visits) else None
    onednn_s = median_of("onednn_s") if all(v.get("onednn_s") for v in visits) else None
    ours_native_s = median_of("ours_native_s") if all(v.get("ours_native_s") for v in visits) else None
    return {
        "op": op, "direction": direction, "dtype": dtype, "shape": list(shape), "ours_s": ours_s, "torch_s": torch_s,
        "onednn_s": onednn_s, "ours_native_s": ours_native_s,
        "ours_bandwidth": moved / ours_s,
        "torch_bandwidth": moved / torch_s if torch_s else None,
        "copy_bandwidth": 2 * COPY_BYTES / copy_s,  # read + write counted
        "visits": visits,
    }


def _overhead_cases(ip):
    """op -> (operator class, its tiny F32 arrays in C order, the functional call on them with out= given)."""
    ones = lambda *shape: np.ones(shape, np.float32)  # noqa: E731
    grad_y, x, w = ones(4, 8), ones(4, 8), ones(8)
    rms_out = (ones(4, 8), ones(8))
    grad_output, weight, xhat, std = ones(4, 8), ones(8), ones(4, 8), ones(4)
    layer_out = (ones(4, 8), ones(8), ones(8))
    input, batch_grad_output = ones(2, 4, 8), ones(2, 4, 8)
    channel_weight, running_mean, running_var = ones(4), ones(4), ones(4)
    batch_out = (ones(2, 4, 8), ones(4), ones(4))
    return {
        "rms_norm": (ip.RMSNormBackward, (*rms_out, grad_y, x, w),
                     lambda: ip.rms_norm_backward(grad_y, x, w, out=rms_out)),
        "layer_norm": (ip.LayerNormBackward, (*layer_out, grad_output, weight, xhat, std),
                       lambda: ip.layer_norm_backward(grad_output, weight, xhat, std, out=layer_out)),
        "batch_norm": (ip.BatchNormBackward,
                       (*batch_out, input, batch_grad_output, channel_weight, running_mean, running_var),
                       lambda: ip.batch_norm_backward(input, batch_grad_output, channel_weight, running_mean,
                                                      running_var, out=batch_out)),
    }


def python_overheads(repeats, rounds=9, ops=("rms_norm", "layer_norm", "batch_norm")):
    """{"functional": op -> seconds, "operator": op -> seconds}: the Python time of a cached functional call, and
    of an operator object's call, beyond the native run on a tiny shape. Each is the median, over alternating
    rounds, of (the call - the bare C call on the same descriptor), so drifting load on a shared machine hits
    both sides of each difference alike."""
    import infiniop_py as ip

    cases = {op: case for op, case in _overhead_cases(ip).items() if op in ops}
    differences = {way: {op: [] for op in cases} for way in ("functional", "operator")}
    with ip.Handle("cpu") as handle, contextlib.ExitStack() as stack:
        calls, workspaces = {}, []  # the native calls only have the workspaces' addresses: keep them alive
        for op, (operator_class, arrays, functional) in cases.items():
            operator = stack.enter_context(operator_class(handle, *arrays))
            workspaces.append(np.empty(max(operator.workspace_size, 1), np.uint8))
            native = native_call(operator, [a.ctypes.data for a in arrays], workspaces[-1].ctypes.data)
            calls[op] = native, {"functional": functional,
                                 "operator": lambda operator=operator, arrays=arrays: operator(*arrays)}
        for _ in range(rounds):
            for op, (native, ways) in calls.items():
                for way, call in ways.items():
                    differences[way][op].append(median_seconds(call, 300, 0.05) - median_seconds(native, 300, 0.05))
    return {way: {op: statistics.median(values) for op, values in by_op.items()}
            for way, by_op in differences.items()}


def peers(report):
    """[(result key, label)] of the implementations timed beside torch: the report's own list (the GPU's
    Liger-Kernel and cuDNN), else oneDNN where the CPU run timed it."""
    if report.get("peers") is not None:
        return [tuple(peer) for peer in report["peers"]]
    return [("onednn_s", "oneDNN")] if report.get("onednn") else []


def speedup_over(result, key):
    """Our speedup over the implementation timed under key in a result row, or None where it was not timed. A peer
    is set against our bare C call where the row has one (ours_native_s: oneDNN's is a bare call too), torch against
    the operator object's call (torch's own is a Python call)."""
    other_s = result.get(key)
    if not other_s:
        return None
    ours_s = result.get("ours_native_s") if key != "torch_s" and result.get("ours_native_s") else result["ours_s"]
    return other_s / ours_s


def slowest_speedup(result, keys):
    """Our smallest speedup over torch and the peers in a result row ("vs best"), or None where none was timed."""
    return min((s for s in (speedup_over(result, key) for key in ["torch_s", *keys]) if s), default=None)


def format_table(report):
    """The report as a Markdown table. Where the results carry their own copy_bandwidth (the CPU's, timed with each
    case) the fractions use it and a last column shows it; otherwise they use the report's one copy. Each peer
    (peers()) gets its time and our speedup over it, and then "vs best" is our speedup over the fastest other."""
    copy = report["copy_bandwidth"]
    per_case_copy = all("copy_bandwidth" in r for r in report["results"])
    threads = f"; threads: {report['threads']}" if report["threads"] else ""
    copy_header, copy_rule = (" copy GB/s |", "---:|") if per_case_copy else ("", "")
    others = peers(report)
    peer_header = "".join(f" {label} ms | vs {label} |" for _, label in others) + (" vs best |" if others else "")
    peer_rule = "---:|---:|" * len(others) + ("---:|" if others else "")
    # Where peers were set against our bare C call (speedup_over), its time gets a column of its own.
    bare = any(r.get("ours_native_s") for r in report["results"])
    bare_header, bare_rule = (" ours C ms |", "---:|") if bare else ("", "")
    names = [name for name in (report.get("onednn"), *report.get("peer_versions", ())) if name]
    lines = [
        f"machine: {report['machine']}{threads}; torch {report['torch_version']}"
        + "".join(f"; {name}" for name in names),
        f"copy bandwidth ({report.get('copy_method', 'best of numpy/torch copy, same run')}): {copy / 1e9:.1f} GB/s",
        "",
        f"| op | dtype | shape | ours ms |{bare_header} torch ms | speedup |{peer_header} ours GB/s | ours/copy | "
        f"torch/copy |{copy_header}",
        f"|---|---|---|---:|{bare_rule}---:|---:|{peer_rule}---:|---:|---:|{copy_rule}",
    ]
    speedups = {key: [] for key in ["torch_s", *(key for key, _ in others), "best"]}
    for r in report["results"]:
        case_copy = r.get("copy_bandwidth", copy)
        torch_ms = f"{r['torch_s'] * 1e3:.3f}" if r["torch_s"] else "-"
        cells = ""
        for key, _ in others + ([("best", None)] if others else []):
            other_speedup = (slowest_speedup(r, [k for k, _ in others]) if key == "best"
                             else speedup_over(r, key))
            if other_speedup:
                speedups[key].append(other_speedup)
            ms_cell = "" if key == "best" else (f" {r[key] * 1e3:.3f} |" if r.get(key) else " - |")
            cells += ms_cell + (f" {other_speedup:.2f}x |" if other_speedup else " - |")
        speedup = speedup_over(r, "torch_s")
        if speedup:
            speedups["torch_s"].append(speedup)
        speedup_cell = f"{speedup:.2f}x" if speedup else "-"
        torch_fraction = f"{r['torch_bandwidth'] / case_copy:.2f}" if r["torch_bandwidth"] else "-"
        copy_cell = f" {case_copy / 1e9:.1f} |" if per_case_copy else ""
        bare_cell = (f" {r['ours_native_s'] * 1e3:.3f} |" if r.get("ours_native_s") else " - |") if bare else ""
        lines.append(
            f"| {_op_label(r)} | {r['dtype']} | {shape_label(r)} | {r['ours_s'] * 1e3:.3f} |{bare_cell} {torch_ms} | "
            f"{speedup_cell} |{cells} {r['ours_bandwidth'] / 1e9:.1f} | {r['ours_bandwidth'] / case_copy:.2f} | "
            f"{torch_fraction} |{copy_cell}"
        )
    labels = {"torch_s": "torch", "best": "the fastest other", **dict(others)}
    summaries = [f"median speedup over {labels[key]}: {statistics.median(values):.2f}x; "
                 f"slowest case: {min(values):.2f}x" for key, values in speedups.items() if values]
    if summaries:
        lines += [""] + summaries
    if bare:
        lines.append("ours ms and vs torch: the operator object's call (torch's is a Python call too); ours C ms and "
                     "vs the peers: the bare C call of the same descriptor, as the peers' calls are")
    for note in report.get("onednn_notes") or ():
        lines.append(f"no oneDNN time for {note}")
    if report.get("onednn_unavailable"):
        lines.append(f"no oneDNN column: {report['onednn_unavailable']}")
    lines += report.get("peer_notes") or []
    overheads = report.get("functional_overheads_s") or (
        {"rms_norm": report["functional_overhead_s"]} if report["functional_overhead_s"] is not None else None)
    for what, by_op in (("functional API Python overhead per cached call", overheads),
                        ("operator object Python overhead per call", report.get("operator_overheads_s"))):
        if by_op:
            lines.append(f"{what}: " + ", ".join(f"{op} {seconds * 1e6:.1f} us" for op, seconds in by_op.items()))
    return "\n".join(lines)


def _op_label(result):
    """The op's name in a table or plot: a forward's says so (the backward's is the op's name alone)."""
    return result["op"] + (" forward" if result.get("direction") == "forward" else "")


def shape_label(result):
    """A row's shape as 4096x4096, with the layout where the row names one (channels_last: 128x64x56x56 NHWC)."""
    shape = "x".join(map(str, result["shape"]))
    return f"{shape} NHWC" if result.get("layout") == "channels_last" else shape


def plot(report, path):
    """Fraction of copy per case: ours, torch's and (where timed) oneDNN's bars side by side, the speedup over
    torch above each group."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = report["results"]
    labels = [f"{_op_label(r)} {r['dtype']}\n{shape_label(r)}" for r in results]
    copies = [r.get("copy_bandwidth", report["copy_bandwidth"]) for r in results]
    moved = [bytes_moved(r["dtype"], r["shape"], r.get("direction", "backward")) for r in results]
    series = [("infiniop-py", "ours_s"), (f"torch {report['torch_version']}", "torch_s")]
    if report.get("onednn"):
        series.append((report["onednn"], "onednn_s"))
    width = 0.8 / len(series)
    positions = np.arange(len(results))
    figure, axes = plt.subplots(figsize=(min(22, max(8, 0.55 * len(results))), 6.5))
    for index, (name, key) in enumerate(series):
        fractions = [(m / r[key]) / c if r.get(key) else 0 for r, m, c in zip(results, moved, copies)]
        axes.bar(positions + (index - (len(series) - 1) / 2) * width, fractions, width, label=name)
    axes.axhline(1.0, color="gray", linestyle="--", linewidth=1)
    axes.set_xticks(positions, labels, fontsize=9, rotation=60, ha="right", rotation_mode="anchor")
    axes.set_ylabel("effective bandwidth / copy bandwidth", fontsize=12)
    for position, result, m, c in zip(positions, results, moved, copies):  # the speedup over torch
        if result["torch_s"]:
            top = max(m / result[key] / c for _, key in series if result.get(key))
            axes.annotate(f"{result['torch_s'] / result['ours_s']:.1f}x", (position, top), textcoords="offset points",
                          xytext=(0, 3), ha="center", fontsize=9)
    axes.set_title(report["machine"] + (f", {report['threads']} threads" if report["threads"] else "")
                   + "; above each group: speedup over torch", fontsize=12)
    axes.legend(fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


