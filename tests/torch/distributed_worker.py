"""One rank of the multi-process tests (test_torch_distributed.py starts WORLD_SIZE of these on 127.0.0.1): runs
every check on its shard and saves what it saw to OUT_DIR/rank<RANK>.pt, for the parent to compare."""

import os
import sys

import torch
import torch.distributed as dist

import infiniop_py.torch as ipt

RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
BACKEND = os.environ.get("BACKEND", "gloo")  # nccl: each rank on GPU RANK
DEVICE = torch.device("cuda", RANK) if BACKEND == "nccl" else torch.device("cpu")
CHANNELS = 5


def shard_sizes(total_rows):
    """Uneven shards, one of them empty where there are three ranks: rows 3, 1 / 2, 0, 3."""
    return {2: [3, 1], 3: [2, 0, 3]}[WORLD] if total_rows is None else [total_rows // WORLD] * WORLD


def my_shard(tensor, sizes):
    start = sum(sizes[:RANK])
    return tensor[start:start + sizes[RANK]]


def sync_batch_norm_step(dtype, channels_last, momentum):
    """SyncBatchNorm on this rank's shard of one global batch (same seed everywhere): output, grads, buffers."""
    generator = torch.Generator().manual_seed(7)
    sizes = shard_sizes(None)
    x = (torch.randn(sum(sizes), CHANNELS, 4, 3, generator=generator) * 2 + 1).to(dtype)
    grad = torch.randn(x.shape, generator=generator).to(dtype)
    module = ipt.SyncBatchNorm(CHANNELS, momentum=momentum, dtype=torch.float64 if dtype == torch.float64 else None)
    with torch.no_grad():
        module.weight.copy_(torch.randn(CHANNELS, generator=generator))
        module.bias.copy_(torch.randn(CHANNELS, generator=generator))
    module.to(DEVICE)
    local = my_shard(x, sizes).clone().to(DEVICE)
    if channels_last:
        local = local.contiguous(memory_format=torch.channels_last)
    local.requires_grad_()
    output = module(local)
    output.backward(my_shard(grad, sizes).to(DEVICE))
    return {"x": x, "grad_output": grad, "sizes": sizes, "output": output.detach().cpu(),
            "grad_input": local.grad.cpu(), "grad_weight": module.weight.grad.cpu(), "grad_bias": module.bias.grad.cpu(),
            "state": {name: value.clone().cpu() for name, value in module.state_dict().items()},
            "initial_state": {"weight": module.weight.detach().clone(), "bias": module.bias.detach().clone()}}


def ddp_training(steps=5):
    """A conv net with BatchNorm2d converted to SyncBatchNorm, in DistributedDataParallel, on equal shards: losses
    and final parameters (the parent compares them with one process training on the whole batch)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 6, 3, bias=False), torch.nn.BatchNorm2d(6), torch.nn.ReLU(),
                                torch.nn.Flatten(), torch.nn.Linear(6 * 6 * 6, 4))
    model = ipt.SyncBatchNorm.convert_sync_batchnorm(model).to(DEVICE)
    assert type(model[1]) is ipt.SyncBatchNorm
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(3)
    losses = []
    for _ in range(steps):
        x = torch.randn(4 * WORLD, 3, 8, 8, generator=generator)
        labels = torch.randint(0, 4, (4 * WORLD,), generator=generator)
        sizes = shard_sizes(4 * WORLD)
        loss = torch.nn.functional.cross_entropy(ddp(my_shard(x, sizes).to(DEVICE)), my_shard(labels, sizes).to(DEVICE))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        global_loss = loss.detach().clone()
        dist.all_reduce(global_loss)
        losses.append(float(global_loss) / WORLD)
    return {"losses": losses, "state": {k: v.clone().cpu() for k, v in model.state_dict().items()}}


def sharded_row_norms():
    """Each rank's weight gradients of RMSNorm and LayerNorm on its rows (uneven), summed over ranks."""
    generator = torch.Generator().manual_seed(11)
    rows, width = 7, 24
    x = torch.randn(rows, width, generator=generator) * 2 + 0.5
    grad = torch.randn(rows, width, generator=generator)
    sizes = [rows - (WORLD - 1) * 2] + [2] * (WORLD - 1)
    result = {}
    for name, module in (("rms_norm", ipt.RMSNorm(width)), ("layer_norm", ipt.LayerNorm(width))):
        module.to(DEVICE)
        module(my_shard(x, sizes).to(DEVICE)).backward(my_shard(grad, sizes).to(DEVICE))
        for parameter_name, parameter in module.named_parameters():
            summed = parameter.grad.clone()
            dist.all_reduce(summed)
            result[f"{name}.{parameter_name}"] = summed.cpu()
    return result


def refused_mismatch():
    """What SyncBatchNorm(2) raises on 3 channels inside the group (on every rank, before any collective), and
    whether its running mean stayed as it was."""
    if "libasan" in os.environ.get("LD_PRELOAD", ""):  # torch's error would be a C++ exception ASan cannot catch
        return {"error": "not run under the preloaded ASan runtime"}
    module = ipt.SyncBatchNorm(2).to(DEVICE)
    before = module.running_mean.clone()
    try:
        module(torch.randn(4, 3, 2, 2, device=DEVICE))
    except Exception as error:  # noqa: BLE001 - the verdict is the exception's class and message
        return {"error": type(error).__name__, "message": str(error), "unchanged": torch.equal(before,
                                                                                           module.running_mean)}
    return {"error": None}


def refused_double_backward():
    """What a backward with create_graph=True through SyncBatchNorm raises (on every rank, before any collective)."""
    if "libasan" in os.environ.get("LD_PRELOAD", ""):  # the engine rethrows it as a C++ exception ASan cannot catch
        return {"error": "not run under the preloaded ASan runtime"}
    module = ipt.SyncBatchNorm(3).to(DEVICE)
    x = torch.randn(4, 3, 2, 2, device=DEVICE, requires_grad=True)
    try:
        torch.autograd.grad(module(x).square().sum(), x, create_graph=True)
    except RuntimeError as error:
        return {"error": "RuntimeError", "message": str(error)}
    return {"error": None}


def main():
    if BACKEND == "nccl":
        torch.cuda.set_device(DEVICE)
    dist.init_process_group(BACKEND, init_method="env://", rank=RANK, world_size=WORLD)
    results = {"sync_batch_norm": {}}
    for dtype, channels_last, momentum in ((torch.float32, False, 0.1), (torch.float32, True, None),
                                           (torch.float64, False, 0.1), (torch.bfloat16, False, 0.1)):
        key = f"{str(dtype).replace('torch.', '')}{'-channels-last' if channels_last else ''}-momentum-{momentum}"
        results["sync_batch_norm"][key] = sync_batch_norm_step(dtype, channels_last, momentum)
    results["ddp"] = ddp_training()
    results["sharded"] = sharded_row_norms()
    results["refusal"] = refused_mismatch()
    results["double_backward"] = refused_double_backward()
    dist.barrier()
    torch.save(results, os.path.join(os.environ["OUT_DIR"], f"rank{RANK}.pt"))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    # Results saved, group destroyed: skip the interpreter's teardown, in which a rank sometimes aborted (see
    # infiniop_py/bench/distributed.py).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
