"""Benchmark: our operators vs PyTorch on the same data and threads, against a copy measured in the same run
(this module: the CPU, the command line and the table; bench_nvidia.py: the GPU).

Effective bandwidth = 3 x elements x itemsize / time (read two row-sized inputs, write one output; the
O(D) vectors are left out), reported as a fraction of the copy bandwidth. Times are medians. On the CPU the
copy, our op and torch's op are timed in interleaved rounds (each call timed right after an untimed call of
itself), and each case is set against its own rounds' copy: a shared machine's memory bandwidth drifts from
minute to minute, and one copy timed at the start would put that drift into every fraction. The run goes over
all cases several times (visits, each on freshly allocated data) and reports each time as the median over the
visits: a neighbour's burst that slows one visit of a case then does not decide its row.
"""

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

from . import _host_memory

ROW_SHAPES = [(4096, 4096), (32768, 512), (256, 65536), (1, 1048576)]
BATCH_SHAPES = [(32, 256, 1024), (256, 64, 4096), (8192, 64, 16), (4, 2, 1048576)]
DTYPES = ["float32", "bfloat16", "float16"]
COPY_BYTES = 256 << 20  # far beyond every cache


def median_seconds(run, repeats, min_seconds=0.2):
    """Median wall time of run() over at least `repeats` calls (after one warm-up call)."""
    run()
    times = []
    started = time.perf_counter()
    while len(times) < repeats or time.perf_counter() - started < min_seconds:
        begin = time.perf_counter()
        run()
        times.append(time.perf_counter() - begin)
        if len(times) >= 20 * repeats:
            break
    return statistics.median(times)


def interleaved_medians(runs, repeats, min_seconds=0.05):
    """Median wall time of each callable in `runs`, timed in rounds: every round calls each in turn twice and
    times the second call, so each is timed right after itself, as in a loop of repeated calls (timed right after
    the 256 MiB copy, a call would pay for writing back the copy's dirty cache lines, and a small case would find
    the caches cold). All get the same rounds: at least `repeats`, and more until each has run min_seconds in all
    (at most 20 x repeats rounds), so a drift in the machine's speed reaches all of them alike. The fastest sets
    the count, so min_seconds stays small: at 0.2 s, torch's 200 ms RMSNorm ran 67 rounds beside our 3 ms one."""
    times = [[] for _ in runs]
    totals = [0.0] * len(runs)
    while len(times[0]) < repeats or min(totals) < min_seconds:
        for index, run in enumerate(runs):
            run()
            begin = time.perf_counter()
            run()
            times[index].append(time.perf_counter() - begin)
            totals[index] += times[index][-1]
        if len(times[0]) >= 20 * repeats:
            break
    return [statistics.median(own) for own in times]


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
    from . import dtypes
    return dtypes.to_numpy(dtypes.code_of(name))


def bytes_moved(dtype, shape):
    """The traffic the effective bandwidth counts: two row-sized inputs read, one written."""
    return 3 * int(np.prod(shape)) * np.dtype(_numpy_dtype(dtype)).itemsize


class Case:
    """One benchmark case: the data, our operator ready to run, and torch's equivalent call."""

    def __init__(self, op, dtype, shape, rng):
        self.op, self.dtype, self.shape = op, dtype, shape
        self._rng = rng

    def random(self, shape):
        return aligned(self._rng.standard_normal(shape, dtype=np.float32).astype(_numpy_dtype(self.dtype)))


def aligned(values):
    """A copy of values at a 64-byte boundary, as torch allocates. numpy's large arrays start 16 bytes into a
    page, which splits every 64-byte vector load across two cache lines; torch runs on these same buffers (see
    _to_torch), so both sides see the same alignment."""
    placed = _host_memory.aligned_empty(values.shape, values.dtype)
    placed[...] = values
    return placed


def build_case(op, dtype, shape, handle, rng):
    """(case, run_ours, run_torch or None); run_* take no arguments."""
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
    elif op in ("layer_norm", "layer_norm_from_input"):
        x64 = rng.standard_normal(shape)
        mean, std = x64.mean(-1, keepdims=True), np.sqrt(x64.var(-1, keepdims=True) + 1e-5)
        np_dtype = _numpy_dtype(dtype)
        grad_output, weight = case.random(shape), case.random(shape[-1:])
        grad_input, grad_weight, grad_bias = aligned(np.empty_like(grad_output)), np.empty_like(weight), np.empty_like(weight)
        if op == "layer_norm":  # the seed's form: xhat and std
            xhat, std_dev = aligned(((x64 - mean) / std).astype(np_dtype)), std[..., 0].astype(np_dtype)
            operator = ip.LayerNormBackward(handle, grad_input, grad_weight, grad_bias, grad_output, weight, xhat,
                                            std_dev)
            arrays = (grad_input, grad_weight, grad_bias, grad_output, weight, xhat, std_dev)
        else:  # PyTorch's form: the forward's input, mean and rstd (F32)
            row_input = aligned(x64.astype(np_dtype))
            row_mean, row_rstd = mean[..., 0].astype(np.float32), (1 / std[..., 0]).astype(np.float32)
            operator = ip.LayerNormBackwardFromInput(handle, grad_input, grad_weight, grad_bias, grad_output, weight,
                                                     row_input, row_mean, row_rstd)
            arrays = (grad_input, grad_weight, grad_bias, grad_output, weight, row_input, row_mean, row_rstd)
        torch_run = None
        if torch is not None:
            stat_dtype = torch.float32 if dtype == "float32" else _torch_dtype(torch, dtype)
            tin = _to_torch(torch, aligned(x64.astype(np_dtype)))
            tmean = torch.from_numpy(mean.astype(np.float32)).to(stat_dtype)
            trstd = torch.from_numpy((1 / std).astype(np.float32)).to(stat_dtype)
            tgo, tw = _to_torch(torch, grad_output), _to_torch(torch, weight)
            torch_run = lambda: torch.ops.aten.native_layer_norm_backward(  # noqa: E731
                tgo, tin, list(shape[-1:]), tmean, trstd, tw, tw, [True, True, True])
    else:
        x, grad_output, weight = case.random(shape), case.random(shape), case.random(shape[1:2])
        x64 = x.astype(np.float64)
        running_mean = x64.mean(axis=(0, 2)).astype(x.dtype)
        running_var = x64.var(axis=(0, 2)).astype(x.dtype)
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
    workspace = np.empty(operator.workspace_size, dtype=np.uint8)
    return case, operator, (lambda: operator(*arrays, workspace=workspace)), torch_run


def _torch_dtype(torch, name):
    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[name]


def _to_torch(torch, array):
    """A torch tensor on the same memory (numpy cannot hand bfloat16 over, so its bits go as int16)."""
    array = np.ascontiguousarray(array)
    if str(array.dtype) == "bfloat16":
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def cases(ops, dtypes_, quick):
    for op in ops:
        shapes = BATCH_SHAPES if op == "batch_norm" else ROW_SHAPES
        if quick:
            shapes = shapes[:1]
        for dtype in dtypes_:
            for shape in shapes:
                yield op, dtype, shape


def progress(done, total, label):
    width = 30
    filled = width * done // total
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {label:<40}")
    sys.stderr.flush()
    if done == total:
        sys.stderr.write("\n")


def run(args):
    import infiniop_py as ip

    threads = int(os.environ.get("OMP_NUM_THREADS", os.cpu_count() or 1))
    torch = _torch()
    if torch is not None:
        torch.set_num_threads(threads)
    copy, copy_name = copy_call(torch)
    planned = list(cases(args.ops, args.dtypes, args.quick))
    visits = [[] for _ in planned]  # per case, one {copy_s, ours_s, torch_s} per visit
    steps = args.visits * len(planned)
    with ip.Handle(args.device) as handle:
        for visit in range(args.visits):
            for index, (op, dtype, shape) in enumerate(planned):
                progress(visit * len(planned) + index, steps, f"visit {visit + 1}: {op} {dtype} {shape}")
                # The same data in every visit (seeded by case), in fresh allocations.
                case, operator, ours, theirs = build_case(op, dtype, shape, handle, np.random.default_rng(index))
                with operator:
                    participants = [copy, ours] + ([theirs] if theirs is not None else [])
                    copy_s, ours_s, *torch_s = interleaved_medians(participants, args.repeats)
                visits[index].append({"copy_s": copy_s, "ours_s": ours_s, "torch_s": torch_s[0] if torch_s else None})
                del case, operator, ours, theirs  # before the next case allocates its own
        progress(steps, steps, "done")
    results = [case_result(op, dtype, shape, own) for (op, dtype, shape), own in zip(planned, visits)]
    overheads = python_overheads(args.repeats)
    return {
        "machine": machine_description(), "threads": threads,
        "copy_bandwidth": statistics.median(r["copy_bandwidth"] for r in results),
        "copy_method": (f"{copy_name} of {COPY_BYTES >> 20} MiB, interleaved with each case; "
                        f"median over {args.visits} visits, then over cases"),
        "visits": args.visits,
        "torch_version": torch.__version__ if torch is not None else None,
        "functional_overhead_s": overheads["functional"]["rms_norm"],
        "functional_overheads_s": overheads["functional"], "operator_overheads_s": overheads["operator"],
        "results": results,
    }


def case_result(op, dtype, shape, visits):
    """A case's row: each time the median over its visits (each visit's own a median of its rounds)."""
    moved = bytes_moved(dtype, shape)
    median_of = lambda key: statistics.median(v[key] for v in visits)  # noqa: E731
    ours_s, copy_s = median_of("ours_s"), median_of("copy_s")
    torch_s = median_of("torch_s") if all(v["torch_s"] for v in visits) else None
    return {
        "op": op, "dtype": dtype, "shape": list(shape), "ours_s": ours_s, "torch_s": torch_s,
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


def native_call(operator, addresses, workspace_address, stream_address=0):
    """The bare C call of an operator object on data addresses (C order; absent trailing tensors may be left
    out), for timing without the Python layer."""
    from ._ffi import ffi

    pointers = [ffi.cast("void *", address) for address in addresses]
    pointers += [ffi.NULL] * (len(operator.layouts) - len(pointers))
    native, run_native = operator._open_pointer(), operator._run_native
    workspace, size = ffi.cast("void *", workspace_address), operator.workspace_size
    stream = ffi.cast("void *", stream_address)
    return lambda: run_native(native, workspace, size, *pointers, stream)


def machine_description():
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    description = f"{model}, {os.cpu_count()} logical CPUs, {platform.system()} {platform.machine()}"
    # A forced lower ISA changes the CPU kernels' speed severalfold: a table must say it was not the best path.
    forced_isa = os.environ.get("INFINIOP_CPU_ISA")
    return f"{description}, kernels capped at INFINIOP_CPU_ISA={forced_isa}" if forced_isa else description


def format_table(report):
    """The report as a Markdown table. Where the results carry their own copy_bandwidth (the CPU's, timed with each
    case) the fractions use it and a last column shows it; otherwise they use the report's one copy."""
    copy = report["copy_bandwidth"]
    per_case_copy = all("copy_bandwidth" in r for r in report["results"])
    threads = f"; threads: {report['threads']}" if report["threads"] else ""
    copy_header, copy_rule = (" copy GB/s |", "---:|") if per_case_copy else ("", "")
    lines = [
        f"machine: {report['machine']}{threads}; torch {report['torch_version']}",
        f"copy bandwidth ({report.get('copy_method', 'best of numpy/torch copy, same run')}): {copy / 1e9:.1f} GB/s",
        "",
        f"| op | dtype | shape | ours ms | torch ms | speedup | ours GB/s | ours/copy | torch/copy |{copy_header}",
        f"|---|---|---|---:|---:|---:|---:|---:|---:|{copy_rule}",
    ]
    speedups = []
    for r in report["results"]:
        case_copy = r.get("copy_bandwidth", copy)
        speedup = r["torch_s"] / r["ours_s"] if r["torch_s"] else None
        if speedup:
            speedups.append(speedup)
        torch_ms = f"{r['torch_s'] * 1e3:.3f}" if r["torch_s"] else "-"
        speedup_cell = f"{speedup:.2f}x" if speedup else "-"
        torch_fraction = f"{r['torch_bandwidth'] / case_copy:.2f}" if r["torch_bandwidth"] else "-"
        copy_cell = f" {case_copy / 1e9:.1f} |" if per_case_copy else ""
        shape = "x".join(map(str, r["shape"]))
        lines.append(
            f"| {r['op']} | {r['dtype']} | {shape} | {r['ours_s'] * 1e3:.3f} | {torch_ms} | {speedup_cell} | "
            f"{r['ours_bandwidth'] / 1e9:.1f} | {r['ours_bandwidth'] / case_copy:.2f} | {torch_fraction} |{copy_cell}"
        )
    if speedups:
        lines.append("")
        lines.append(f"median speedup over torch: {statistics.median(speedups):.2f}x; "
                     f"slowest case: {min(speedups):.2f}x")
    overheads = report.get("functional_overheads_s") or (
        {"rms_norm": report["functional_overhead_s"]} if report["functional_overhead_s"] is not None else None)
    for what, by_op in (("functional API Python overhead per cached call", overheads),
                        ("operator object Python overhead per call", report.get("operator_overheads_s"))):
        if by_op:
            lines.append(f"{what}: " + ", ".join(f"{op} {seconds * 1e6:.1f} us" for op, seconds in by_op.items()))
    return "\n".join(lines)


def plot(report, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = report["results"]
    labels = [f"{r['op']}\n{r['dtype']}\n{'x'.join(map(str, r['shape']))}" for r in results]
    copies = [r.get("copy_bandwidth", report["copy_bandwidth"]) for r in results]
    ours = [r["ours_bandwidth"] / copy for r, copy in zip(results, copies)]
    theirs = [(r["torch_bandwidth"] or 0) / copy for r, copy in zip(results, copies)]
    positions = np.arange(len(results))
    figure, axes = plt.subplots(figsize=(max(8, 0.6 * len(results)), 5))
    axes.bar(positions - 0.2, ours, 0.4, label="infiniop-py")
    axes.bar(positions + 0.2, theirs, 0.4, label=f"torch {report['torch_version']}")
    axes.axhline(1.0, color="gray", linestyle="--", linewidth=1)
    axes.set_xticks(positions, labels, fontsize=8)
    axes.set_ylabel("effective bandwidth / copy bandwidth", fontsize=11)
    for position, result in zip(positions, results):  # the speedup over torch above each pair of bars
        if result["torch_s"]:
            axes.annotate(f"{result['torch_s'] / result['ours_s']:.1f}x", (position, max(ours[position], theirs[position])),
                          textcoords="offset points", xytext=(0, 3), ha="center", fontsize=8)
    axes.set_title(report["machine"] + (f", {report['threads']} threads" if report["threads"] else "")
                   + "; above the bars: speedup over torch")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="infiniop-py bench",
        description="Time each operator against PyTorch on the same data, as fractions of a copy timed in the same "
                    "rounds (the method: docs/performance.md).")
    parser.add_argument("--device", default="cpu", choices=["cpu", "nvidia"],
                        help="nvidia: on the GPU against PyTorch CUDA, timed with CUDA events")
    parser.add_argument("--device-id", type=int, default=0)
    parser.add_argument("--ops", nargs="+", default=["rms_norm", "layer_norm", "batch_norm"],
                        choices=["rms_norm", "layer_norm", "layer_norm_from_input", "batch_norm"],
                        help="layer_norm_from_input: LayerNorm from the forward's input, mean and rstd (as torch "
                             "saves them) instead of xhat and std")
    parser.add_argument("--dtypes", nargs="+", default=DTYPES, choices=DTYPES)
    parser.add_argument("--repeats", type=int, default=7,
                        help="timed rounds per case at least; each round calls the copy, ours and torch's twice "
                             "and times the second call (medians reported)")
    parser.add_argument("--visits", type=int, default=3,
                        help="CPU: times the run goes over every case, each on fresh data; each time reported is "
                             "the median over the visits")
    parser.add_argument("--quick", action="store_true", help="first shape of each op only")
    parser.add_argument("--training", action="store_true",
                        help="instead: a training step (forward + backward) of norm-heavy models and of each drop-in "
                             "module, torch's norms vs infiniop_py.torch.replace_norms (needs torch)")
    parser.add_argument("--sync-batch-norm", action="store_true",
                        help="instead: SyncBatchNorm forward + backward with 2 gloo processes against BatchNorm on "
                             "one process's half of the batch alone (needs torch)")
    parser.add_argument("--json", metavar="FILE", help="write the raw numbers here")
    parser.add_argument("--plot", metavar="FILE.png", help="draw fraction-of-copy per case (needs matplotlib)")
    args = parser.parse_args(argv)
    if args.plot:  # before minutes of timing, not after
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            parser.error("--plot needs matplotlib: pip install 'infiniop-py[plot]' (or pip install matplotlib)")
    if args.sync_batch_norm:
        from . import bench_distributed
        report = bench_distributed.run(args.repeats, args.dtypes[0])
        print(bench_distributed.format_table(report))
        if args.json:
            with open(args.json, "w") as out:
                json.dump(report, out, indent=2)
        return 0
    if args.training:
        from . import bench_training
        device = "cpu" if args.device == "cpu" else f"cuda:{args.device_id}"
        report = bench_training.run(args.repeats, args.dtypes if args.dtypes != DTYPES else bench_training.DTYPES,
                                    device)
        print(bench_training.format_table(report))
        if args.json:
            with open(args.json, "w") as out:
                json.dump(report, out, indent=2)
        return 0
    if args.device == "nvidia":
        from . import bench_nvidia
        try:
            report = bench_nvidia.run(args)
        except bench_nvidia.Unavailable as why:
            print(f"infiniop-py bench: cannot benchmark nvidia:{args.device_id}: {why}", file=sys.stderr)
            return 2
    else:
        report = run(args)
    print(format_table(report))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(report, out, indent=2)
    if args.plot:
        plot(report, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
