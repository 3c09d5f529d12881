"""Benchmark of SyncBatchNorm (``infiniop-py bench --sync-batch-norm``): the forward + backward step of one
BatchNorm2d layer with 2 gloo processes on 127.0.0.1, each holding half of a batch, against the same step on that
half alone with torch's BatchNorm2d and with this package's (no synchronization). Every rank times the three in
interleaved rounds of a fixed count (so the ranks stay in step: the synchronized step waits for the other
process); rank 0's medians are reported with their ratios: the cost of synchronization."""

import json
import os
import socket
import subprocess
import sys
import tempfile

from .timing import interleaved_medians, machine_description

WORLD = 2
IMAGES = (32, 64, 56, 56)  # the whole batch (N, C, H, W): ResNet's first stage
TIMEOUT_S = 600


def _step(torch, module, x, grad):
    def step():
        x.grad = None
        for parameter in module.parameters():
            parameter.grad = None
        module(x).backward(grad)
    return step


def _rank_main(rank, out_path, repeats, dtype_name, images):
    import torch
    import torch.distributed as dist

    import infiniop_py.torch as ipt

    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=WORLD)
    torch.manual_seed(rank)
    dtype = getattr(torch, dtype_name)
    shard = (images[0] // WORLD, *images[1:])
    x = torch.randn(shard, dtype=dtype).requires_grad_()
    grad = torch.randn(shard, dtype=dtype)
    channels = images[1]
    modules = {"torch BatchNorm2d, alone": torch.nn.BatchNorm2d(channels),
               "infiniop BatchNorm2d, alone": ipt.BatchNorm2d(channels),
               f"infiniop SyncBatchNorm, {WORLD} processes": ipt.SyncBatchNorm(channels)}
    medians = interleaved_medians([_step(torch, module, x, grad) for module in modules.values()], repeats,
                                  min_seconds=0.0)  # a fixed count: every rank runs the same rounds
    if rank == 0:
        with open(out_path, "w") as out:
            json.dump({"machine": machine_description(), "threads": torch.get_num_threads(),
                       "torch_version": torch.__version__, "dtype": dtype_name, "world_size": WORLD,
                       "batch": list(images), "shard": list(shard),
                       "steps": [{"name": name, "seconds": seconds} for name, seconds in zip(modules, medians)]},
                      out, indent=2)
    dist.barrier()  # both ranks leave together: a peer gone mid-teardown can abort gloo's other side
    dist.destroy_process_group()


def _free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run(repeats=7, dtype="float32", images=None):
    """Start the ranks (one thread each: two processes share this machine), wait, and return rank 0's report.
    ``images``: the whole batch's shape, IMAGES by default."""
    images = images or IMAGES
    with tempfile.TemporaryDirectory() as scratch:
        out_path = os.path.join(scratch, "report.json")
        environment = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
                           WORLD_SIZE=str(WORLD), OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
        ranks = [subprocess.Popen([sys.executable, "-m", "infiniop_py.bench.distributed", str(rank), out_path,
                                   str(repeats), dtype, "x".join(map(str, images))],
                                  env=dict(environment, RANK=str(rank)), stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
                 for rank in range(WORLD)]
        try:
            outputs = [rank.communicate(timeout=TIMEOUT_S)[0] for rank in ranks]
        finally:
            for rank in ranks:
                if rank.poll() is None:
                    rank.kill()
        failed = [f"rank {index} exited {rank.returncode}:\n{output[-2000:]}"
                  for index, (rank, output) in enumerate(zip(ranks, outputs)) if rank.returncode != 0]
        if failed:
            raise RuntimeError("a benchmark rank failed\n" + "\n".join(failed))
        with open(out_path) as report:
            return json.load(report)


def format_table(report):
    baseline = report["steps"][0]["seconds"]
    lines = [f"machine: {report['machine']}; {report['world_size']} gloo processes on 127.0.0.1, "
             f"{report['threads']} thread each; torch {report['torch_version']}",
             f"one BatchNorm2d forward + backward, {report['dtype']}, batch {'x'.join(map(str, report['batch']))} "
             f"split in {report['world_size']}: each process steps on {'x'.join(map(str, report['shard']))}", "",
             "| step | ms (median, rank 0) | vs torch alone |", "|---|---:|---:|"]
    for step in report["steps"]:
        lines.append(f"| {step['name']} | {step['seconds'] * 1e3:.2f} | {baseline / step['seconds']:.2f}x |")
    return "\n".join(lines)


if __name__ == "__main__":
    _rank_main(int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4], tuple(map(int, sys.argv[5].split("x"))))
    # The report is written and the group destroyed: leave without the interpreter's teardown, in which a rank
    # sometimes aborted ("terminate called without an active exception", about 1 run in 25 on a 2-core
    # machine): reference cycles still holding the gloo group are freed there, late. torch's own DDP over its
    # own BatchNorm2d does the same; the README's example calls gc.collect() before destroying the group instead.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
