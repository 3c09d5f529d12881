"""Where the PyTorch integration's eager path starts to beat torch's own CPU norms: a module's forward + backward,
ours (this library's path at every size) against torch.nn's, at growing sizes, for the sizes of
infiniop_py.torch.functional._TORCH_BELOW (below them the functionals give CPU inputs to torch's own norms end to
end). Each case is timed in interleaved rounds in one process, malloc keeping freed memory as `bench --training`
makes it (page faults would otherwise rule these sizes). Prints per op, dtype and thread count the ratio ours/stock
at each size and the smallest size from which ours is at most stock's at every larger size measured.

    python scripts/torch_crossings.py [--threads 1 2] [--rounds 15] [--sizes 32768 65536 ...]
"""

import argparse
import statistics
import time

import torch

import infiniop_py.torch as ipt
from infiniop_py.bench.host_overhead import _module_runs
from infiniop_py.bench.training import keep_freed_memory
from infiniop_py.torch import functional

SIZES = (32768, 65536, 131072, 262144, 524288, 1048576)
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# (name, torch.nn class name, row width: a size's input is (size / width, width))
MODULES = (("layer_norm", "LayerNorm", 1024), ("batch_norm", "BatchNorm1d", 256))


def _ratio(class_name, width, size, dtype, rounds, calls):
    """ours / stock of a module step: bench --host-overhead's forward + backward, on (size / width, width)."""
    steps = _module_runs(torch, class_name, (size // width, width), "rows", dtype, torch.device("cpu"),
                         "forward+backward")
    times = [[], []]
    for round_index in range(rounds):
        for index in (0, 1) if round_index % 2 == 0 else (1, 0):
            steps[index]()
            begin = time.perf_counter()
            for _ in range(calls):
                steps[index]()
            times[index].append((time.perf_counter() - begin) / calls)
    return statistics.median(times[1]) / statistics.median(times[0])


def crossing(speedups, sizes):
    """The smallest size from which ours is at least as fast at every larger size measured; None if none is."""
    return next((sizes[i] for i in range(len(sizes)) if all(s >= 1.0 for s in speedups[i:])), None)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), help="elements (multiples of 1024)")
    args = parser.parse_args(argv)
    sizes = args.sizes
    kept = keep_freed_memory()
    functional._TORCH_BELOW = {}  # ours at every size
    print(f"torch {torch.__version__}; malloc keeps freed memory: {kept}; C++ autograd nodes: "
          f"{ipt.autograd_nodes.status()}")
    print("speedup of a module step (stock time / ours) at each size in elements:")
    print("| op | dtype | threads | " + " | ".join(str(size) for size in sizes) + " | ours from |")
    print("|---|---|---:|" + "---:|" * len(sizes) + "---:|")
    for threads in args.threads:
        torch.set_num_threads(threads)
        for name, class_name, width in MODULES:
            for dtype in DTYPES:
                speedups = [1 / _ratio(class_name, width, size, dtype, args.rounds, args.calls)
                            for size in sizes]
                print(f"| {name} | {str(dtype).removeprefix('torch.')} | {threads} | "
                      + " | ".join(f"{s:.2f}x" for s in speedups) + f" | {crossing(speedups, sizes) or '-'} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
