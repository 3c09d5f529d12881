"""`infiniop-py bench` (also scripts/bench.py): the command line of the benchmarks. cpu: our operators against
PyTorch, oneDNN and a copy on the CPU; nvidia: the same on a GPU; training: training steps with the PyTorch
integration; host_overhead: host time per call of the PyTorch integration against stock torch's; distributed:
SyncBatchNorm over 2 processes; timing and onednn: what they share. The method:
docs/performance.md."""

import argparse
import json
import os
import sys
import tempfile

from ..cli import count
from ..handle import resolve_alias
from . import cpu


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="infiniop-py bench",
        description="Time each operator against PyTorch on the same data, as fractions of a copy timed in the same "
                    "rounds (the method: docs/performance.md).")
    parser.add_argument("--device", default="cpu", type=resolve_alias, choices=["cpu", "nvidia"],
                        help="nvidia (or cuda): on the GPU against PyTorch CUDA, timed with CUDA events")
    parser.add_argument("--device-id", type=count(0), default=0)
    parser.add_argument("--ops", nargs="+", default=["rms_norm", "layer_norm", "batch_norm"],
                        choices=["rms_norm", "layer_norm", "layer_norm_from_input", "batch_norm"],
                        help="layer_norm_from_input: LayerNorm from the forward's input, mean and rstd (as torch "
                             "saves them) instead of xhat and std")
    parser.add_argument("--forward", action="store_true",
                        help="time the forwards instead (ours saving what our backward takes, against torch's "
                             "training forwards, and oneDNN's on the CPU, Liger-Kernel's and cuDNN's on a GPU)")
    parser.add_argument("--dtypes", nargs="+", default=cpu.DTYPES, choices=cpu.DTYPES)
    parser.add_argument("--repeats", type=count(1), default=7,
                        help="timed rounds per case at least; each round calls the copy, ours and torch's twice "
                             "and times the second call (medians reported)")
    parser.add_argument("--visits", type=count(1), default=3,
                        help="CPU: times the run goes over every case, each on fresh data; each time reported is "
                             "the median over the visits")
    parser.add_argument("--quick", action="store_true", help="first shape of each op only")
    parser.add_argument("--shapes", default="table", choices=cpu.SHAPE_SETS,
                        help="CPU: table (the published table's shapes), llm (mid-size shapes of LLM and CNN "
                             "training) or short (a million elements in rows of 16-256)")
    parser.add_argument("--no-onednn", dest="onednn", action="store_false",
                        help="CPU: leave out the oneDNN column (it is timed where oneDNN is installed: "
                             "pip install 'infiniop-py[onednn]')")
    parser.add_argument("--training", action="store_true",
                        help="instead: a training step (forward + backward) of norm-heavy models and of each drop-in "
                             "module, torch's norms vs infiniop_py.torch.replace_norms (needs torch)")
    parser.add_argument("--host-overhead", action="store_true",
                        help="instead: host time per call (CUDA: until the call returns, not synchronized) of "
                             "infiniop_py.torch's modules and functional backward against stock torch's, on tiny "
                             "tensors (needs torch); --repeats x 5 rounds of 10 calls each")
    parser.add_argument("--sync-batch-norm", action="store_true",
                        help="instead: SyncBatchNorm forward + backward with 2 gloo processes against BatchNorm on "
                             "one process's half of the batch alone (needs torch)")
    parser.add_argument("--json", metavar="FILE", help="write the raw numbers here")
    parser.add_argument("--plot", metavar="FILE.png", help="draw fraction-of-copy per case (needs matplotlib)")
    args = parser.parse_args(argv)
    if args.forward:
        from . import forward
        missing = [op for op in args.ops if op not in forward.OPS]
        if missing:
            parser.error(f"--forward: no forward of {', '.join(missing)} (forwards: {', '.join(forward.OPS)})")
    # The output paths and matplotlib are checked before minutes of timing, not after.
    for option, path in (("--json", args.json), ("--plot", args.plot)):
        if path and not _writable(path):
            parser.error(f"{option}: cannot write {path} (a folder, or in a folder that is missing or read-only)")
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            parser.error("--plot needs matplotlib: pip install 'infiniop-py[plot]' (or pip install matplotlib)")
    if args.host_overhead:
        from . import host_overhead
        device = "cpu"
        if args.device == "nvidia":
            from . import nvidia
            try:
                nvidia.require_cuda(args.device_id)
            except nvidia.Unavailable as why:
                print(f"infiniop-py bench: cannot benchmark nvidia:{args.device_id}: {why}", file=sys.stderr)
                return 2
            device = f"cuda:{args.device_id}"
        dtypes = args.dtypes if args.dtypes != cpu.DTYPES else host_overhead.DTYPES
        report = host_overhead.run(args.repeats, dtypes, device)
        table = host_overhead.format_table(report)
    elif args.sync_batch_norm:
        from . import distributed
        report = distributed.run(args.repeats, args.dtypes[0])
        table = distributed.format_table(report)
    elif args.training:
        from . import training
        device = "cpu" if args.device == "cpu" else f"cuda:{args.device_id}"
        report = training.run(args.repeats, args.dtypes if args.dtypes != cpu.DTYPES else training.DTYPES, device)
        table = training.format_table(report)
    else:
        if args.device == "nvidia":
            from . import nvidia
            try:
                report = nvidia.run(args)
            except nvidia.Unavailable as why:
                print(f"infiniop-py bench: cannot benchmark nvidia:{args.device_id}: {why}", file=sys.stderr)
                return 2
        else:
            report = cpu.run(args)
        table = cpu.format_table(report)
    print(table)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(report, out, indent=2)
    if args.plot and not (args.sync_batch_norm or args.training or args.host_overhead):  # the operator tables only
        cpu.plot(report, args.plot)
    return 0


def _writable(path):
    """Whether a file can be written at ``path``: a file made in its folder and removed (os.access says yes to root
    wherever the mode bits do)."""
    if os.path.isdir(path):
        return False
    try:
        tempfile.TemporaryFile(dir=os.path.dirname(os.path.abspath(path))).close()
    except OSError:
        return False
    return True
