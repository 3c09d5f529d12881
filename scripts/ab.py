#!/usr/bin/env python3
"""A/B timing of two builds of the library, or two ISA paths of one, on one benchmark case: the method behind the
"A/B in alternating processes" numbers of docs/performance.md. On a shared VM a process's speed moves with the
machine's phases, so A and B run in separate processes, alternating ABBA..., each on the same data (the
benchmark's case, seeded), and each sample carries the copy bandwidth its process measured. It also says whether
both sides' gradients have the same bits.

    python scripts/ab.py A B --op layer_norm --dtype bfloat16 --shape 4096x4096 [--forward] [--processes 6]
                         [--calls 30] [--threads 2] [--after-copy] [--json]
    python scripts/ab.py A B --device nvidia --op batch_norm --dtype float16 --shape 128x512x7x7
                         [--layout channels_last] [--processes 2]
    python scripts/ab.py A B --device nvidia --cases FILE [--processes 2] [--json]

--cases FILE: one case a line (the case options above: --op, --dtype, --shape, --forward, --layout), all of them
timed in each process, so that a GPU session pays a process's start (torch, CUDA) once per side, not once per case;
the report is then one per case, in the file's order.

A and B: a directory holding libinfiniop.so (set as INFINIOP_PY_LIBRARY_DIR), or `installed` for the library the
package finds itself, each optionally followed by `:ISA` (INFINIOP_CPU_ISA), e.g. `installed:avx2`. Without
--after-copy the calls run back to back (the data in the caches where it fits); with it each timed call follows a
256 MiB copy and one untimed call, as the benchmark's rounds do. --forward times the op's forward (`bench --forward`'s
case) instead of its backward. Each process reports the median of its calls.

--device nvidia (GPU 0): the backward of `bench --device nvidia`'s case (BatchNorm: training, saved statistics, F32
parameters, --layout), or with --forward its training forward (`bench --device nvidia --forward`'s case), timed as that benchmark times it, in a CUDA graph of 10 calls (median of --calls replays, three
times; the sample is their median): a kernel change measured in the library itself, against the build before it
(scripts/prebuild_gpu_ab.sh packs builds for a GPU session; scripts/gpu_ab.sh runs this there).
"""

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time


def _child(args):
    """One process's sample: {median_s, min_s, copy_gbs, bits}."""
    import numpy as np

    import infiniop_py as ip
    from infiniop_py.bench import forward
    from infiniop_py.bench.cpu import COPY_BYTES, _torch, build_case, copy_call

    torch = _torch()
    if torch is not None:
        torch.set_num_threads(args.threads)
    copy, _ = copy_call(torch)
    shape = tuple(int(size) for size in args.shape.split("x"))
    with ip.Handle("cpu") as handle:
        case, operator, run, _, _ = (forward.build_case if args.forward else build_case)(args.op, args.dtype, shape, handle, np.random.default_rng(0))
        with operator:
            run()
            bits = hashlib.sha256(b"".join(np.ascontiguousarray(out).tobytes() for out in case.outputs)).hexdigest()
            times = []
            for _ in range(args.calls):
                if args.after_copy:
                    copy()
                run()
                begin = time.perf_counter()
                run()
                times.append(time.perf_counter() - begin)
    copies = []
    for _ in range(5):
        begin = time.perf_counter()
        copy()
        copies.append(time.perf_counter() - begin)
    return {"median_s": statistics.median(times), "min_s": min(times),
            "copy_gbs": 2 * COPY_BYTES / statistics.median(copies) / 1e9, "bits": bits[:16]}


def _child_nvidia(args):
    """One process's sample on GPU 0: {median_s, min_s, copy_gbs, bits} of `bench --device nvidia`'s case."""
    import infiniop_py as ip
    from infiniop_py.bench import nvidia, nvidia_forward

    torch = nvidia.require_cuda(0)  # cached by torch: each case after the first pays nothing here
    device = "cuda:0"
    torch.cuda.set_device(device)
    shape = tuple(int(size) for size in args.shape.split("x"))
    stream = torch.cuda.Stream(device)
    generator = torch.Generator(device=device).manual_seed(0)
    with ip.Handle("nvidia", 0) as handle, torch.cuda.stream(stream):
        case_class = nvidia_forward.GpuForwardCase if args.forward else nvidia.GpuCase
        case = case_class(torch, args.op, args.dtype, shape, handle, device, generator, args.layout, stream)
        try:
            runs = sorted(nvidia.graph_seconds(torch, case.ours, stream, replays=args.calls) for _ in range(3))
            case.outputs()
            stream.synchronize()
            outputs = [t for t in case._tensors[:3] if t is not None]  # the outputs (and an input: both sides alike)
            bits = hashlib.sha256(b"".join(t.contiguous().view(-1).view(torch.uint8).cpu().numpy().tobytes()
                                           for t in outputs)).hexdigest()
        finally:
            case.close()
    copy = nvidia.copy_bandwidth(torch, device, 5)
    return {"median_s": runs[1], "min_s": runs[0], "copy_gbs": copy / 1e9, "bits": bits[:16]}


def _with_case(args, case):
    """The run's options with one --cases line's in place of --op, --dtype, --shape, --forward and --layout."""
    return argparse.Namespace(**{**vars(args), **vars(case)})


def _child_cases(args):
    """One process's samples of every case of --cases, in order; a case that raises gets {"error": ...} and the rest
    still run. A machine that cannot run any case (no GPU, no torch) fails the process as one case would."""
    cases = _read_cases(args.cases)
    if args.device == "nvidia":
        from infiniop_py.bench import nvidia

        nvidia.require_cuda(0)
    samples = []
    for case in cases:
        case_args = _with_case(args, case)
        try:
            samples.append((_child_nvidia if args.device == "nvidia" else _child)(case_args))
        except Exception as error:  # noqa: BLE001: the error is the case's report
            samples.append({"error": f"{type(error).__name__}: {error}"})
    return samples


OPS = ("rms_norm", "layer_norm", "layer_norm_from_input", "batch_norm")
DTYPES = ("float32", "bfloat16", "float16")
LAYOUTS = ("channels_first", "channels_last")


def _case_parser():
    parser = argparse.ArgumentParser(prog="a line of --cases", add_help=False)
    parser.add_argument("--op", choices=OPS, required=True)
    parser.add_argument("--dtype", choices=DTYPES, required=True)
    parser.add_argument("--shape", required=True)
    parser.add_argument("--forward", action="store_true")
    parser.add_argument("--layout", choices=LAYOUTS, default="channels_first")
    return parser


def _read_cases(path):
    """The cases of a --cases file: a Namespace of the case options a line (blank lines and # comments skipped)."""
    with open(path) as file:
        lines = [line.strip() for line in file]
    return [_case_parser().parse_args(line.split()) for line in lines if line and not line.startswith("#")]


def _environment(side, threads):
    directory, _, isa = side.partition(":")
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    for name in ("INFINIOP_PY_LIBRARY_DIR", "INFINIOP_CPU_ISA"):
        env.pop(name, None)
    if directory != "installed":
        if not os.path.isfile(os.path.join(directory, "libinfiniop.so")):
            raise SystemExit(f"{side}: no libinfiniop.so in {directory!r}")
        env["INFINIOP_PY_LIBRARY_DIR"] = os.path.abspath(directory)
    if isa:
        env["INFINIOP_CPU_ISA"] = isa
    return env


def _sample(side, args):
    """One process's sample (with --cases: its list of samples, a case each)."""
    command = [sys.executable, os.path.abspath(__file__), "--child", "--calls", str(args.calls),
               "--threads", str(args.threads), "--device", args.device]
    if args.cases:
        command += ["--cases", os.path.abspath(args.cases)]
    else:
        command += ["--op", args.op, "--dtype", args.dtype, "--shape", args.shape, "--layout", args.layout]
        command += ["--forward"] * args.forward
    command += ["--after-copy"] * args.after_copy
    result = subprocess.run(command, env=_environment(side, args.threads), capture_output=True, text=True,
                            timeout=600)
    if result.returncode != 0:
        raise SystemExit(f"{side}: the timing process failed:\n{result.stderr}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def compare(args):
    """{side: [samples]} in ABBA order, and the summary (with --cases: a list of them, a case each)."""
    sides = {"A": args.a, "B": args.b}
    samples = {"A": [], "B": []}
    for process in range(args.processes):
        for name in ("AB" if process % 2 == 0 else "BA"):
            samples[name].append(_sample(sides[name], args))
    if not args.cases:
        return _summary(args, sides, samples)
    return [_summary(_with_case(args, case), sides,
                     {name: [process[index] for process in own] for name, own in samples.items()})
            for index, case in enumerate(_read_cases(args.cases))]


def _summary(args, sides, samples):
    """One case's report from its samples, {side: [sample a process]}."""
    errors = sorted({s["error"] for own in samples.values() for s in own if "error" in s})
    if errors:
        return {"case": _case_name(args), "device": args.device, "forward": args.forward, "sides": sides,
                "error": "; ".join(errors)}
    a, b = ([s["median_s"] for s in samples[name]] for name in "AB")
    every = samples["A"] + samples["B"]
    return {
        "case": _case_name(args),
        "device": args.device, "forward": args.forward, "threads": args.threads,
        "after_copy": args.after_copy,
        "sides": sides, "samples": samples,
        "b_over_a_median": statistics.median(b) / statistics.median(a),
        "b_over_a_min": min(b) / min(a),
        "same_bits": len({s["bits"] for s in every}) == 1,
        "copy_gbs": [min(s["copy_gbs"] for s in every), max(s["copy_gbs"] for s in every)],
    }


def _case_name(args):
    return f"{args.op} {args.dtype} {args.shape}" + (f" {args.layout}" if args.op == "batch_norm" else "")


def format_report(report):
    if "error" in report:
        return f"{report['case']}{' forward' if report['forward'] else ''}: failed: {report['error']}"
    if report["device"] == "nvidia":
        lines = [f"{report['case']} on the GPU, CUDA graphs of 10 calls"]
    else:
        lines = [f"{report['case']}{' forward' if report['forward'] else ''}, {report['threads']} threads, "
                 f"{'each call after a 256 MiB copy' if report['after_copy'] else 'calls back to back'}"]
    for name, side in report["sides"].items():
        own = report["samples"][name]
        lines.append(f"{name} {side}: ms per process " + " ".join(f"{s['median_s'] * 1e3:.3f}" for s in own)
                     + " (copy GB/s " + " ".join(f"{s['copy_gbs']:.0f}" for s in own) + ")")
    lines.append(f"B/A time: {report['b_over_a_median']:.3f} (medians), {report['b_over_a_min']:.3f} (minimums); "
                 f"copy {report['copy_gbs'][0]:.0f}-{report['copy_gbs'][1]:.0f} GB/s; "
                 f"{'same bits' if report['same_bits'] else 'DIFFERENT BITS'}")
    return "\n".join(lines)


def argument_parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a", nargs="?")
    parser.add_argument("b", nargs="?")
    parser.add_argument("--op", choices=OPS)
    parser.add_argument("--dtype", choices=DTYPES)
    parser.add_argument("--shape", help="e.g. 4096x4096, or 256x64x4096 for batch_norm")
    parser.add_argument("--cases", help="a file of cases, one a line, instead of --op, --dtype and --shape")
    parser.add_argument("--processes", type=int, default=6, help="processes per side (default 6)")
    parser.add_argument("--calls", type=int, default=30, help="timed calls per process (default 30)")
    parser.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", 2)))
    parser.add_argument("--after-copy", action="store_true", help="each timed call after a 256 MiB copy")
    parser.add_argument("--forward", action="store_true", help="time the forward instead of the backward")
    parser.add_argument("--device", choices=("cpu", "nvidia"), default="cpu")
    parser.add_argument("--layout", choices=LAYOUTS, default="channels_first",
                        help="BatchNorm on nvidia: the data's layout")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return parser


def main(argv=None):
    parser = argument_parser()
    args = parser.parse_args(argv)
    if args.cases and any(getattr(args, name) not in (None, False) for name in ("op", "dtype", "shape", "forward")):
        parser.error("--cases replaces --op, --dtype, --shape and --forward")
    if not args.cases and None in (args.op, args.dtype, args.shape):
        parser.error("--op, --dtype and --shape are required (or --cases)")
    if args.child:
        child = _child_cases if args.cases else _child_nvidia if args.device == "nvidia" else _child
        print(json.dumps(child(args)))
        return 0
    if args.a is None or args.b is None:
        parser.error("A and B are required")
    if args.cases:
        _read_cases(args.cases)  # a bad line fails here, before any process starts
    report = compare(args)
    reports = report if args.cases else [report]
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print("\n\n".join(format_report(one) for one in reports))
    return 1 if any("error" in one for one in reports) else 0


if __name__ == "__main__":
    sys.exit(main())
