"""SyncBatchNorm and sharded row norms over torch.distributed: 2 and 3 gloo processes on 127.0.0.1 (uneven shards,
an empty one among three), against one process on the whole batch. Each world size is started once, every check
runs in it (distributed_worker.py), and a rank that hangs is killed."""

import inspect
import os
import socket
import subprocess
import sys

import pytest

from _torch_helpers import TORCH_ERRORS_CRASH, TORCH_ERRORS_CRASH_REASON, error, torch

import infiniop_py.torch as ipt

WORKER = os.path.join(os.path.dirname(__file__), "distributed_worker.py")
TIMEOUT_S = 240


def _free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _launch(world_size, out_dir, backend="gloo"):
    """Run world_size ranks to completion; kill them all if any fails or the time runs out."""
    environment = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
                       WORLD_SIZE=str(world_size), OUT_DIR=str(out_dir), OMP_NUM_THREADS="1",
                       GLOO_SOCKET_IFNAME="lo", BACKEND=backend)
    ranks = [subprocess.Popen([sys.executable, WORKER], env=dict(environment, RANK=str(rank)),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for rank in range(world_size)]
    try:
        outputs = [rank.communicate(timeout=TIMEOUT_S)[0] for rank in ranks]
    except subprocess.TimeoutExpired:
        for rank in ranks:
            rank.kill()
        pytest.fail(f"a rank of {world_size} hung for {TIMEOUT_S} s and was killed")
    finally:
        for rank in ranks:
            if rank.poll() is None:
                rank.kill()
    failed = [(index, rank.returncode, output) for index, (rank, output) in enumerate(zip(ranks, outputs))
              if rank.returncode != 0]
    assert not failed, "\n".join(f"rank {index} exited {code}:\n{output}" for index, code, output in failed)
    return [torch.load(os.path.join(out_dir, f"rank{rank}.pt"), weights_only=False) for rank in range(world_size)]


def _nccl_unusable_reason(world_size):
    if not torch.distributed.is_nccl_available():
        return f"NCCL variant: torch {torch.__version__} is built without NCCL (a CPU build)"
    if torch.cuda.device_count() < world_size:
        return f"NCCL variant: needs {world_size} GPUs, this machine has {torch.cuda.device_count()}"
    return None


@pytest.fixture(scope="module", params=[(2, "gloo"), (3, "gloo"), pytest.param((2, "nccl"), marks=pytest.mark.nvidia)],
                ids=["2-ranks", "3-ranks", "2-gpus-nccl"])
def ranks(request, tmp_path_factory):
    world_size, backend = request.param
    if backend == "nccl" and _nccl_unusable_reason(world_size):
        pytest.skip(_nccl_unusable_reason(world_size))
    return _launch(world_size, tmp_path_factory.mktemp(f"world{world_size}-{backend}"), backend)


def _close(actual, expected, bound, what):
    relative = error(actual, expected)
    assert relative <= bound, f"{what}: {relative:.3g} > {bound}"


BOUNDS = {"float64": 1e-12, "float32": 2e-5, "bfloat16": 1.6e-2}


def test_sync_batch_norm_equals_one_process_on_the_whole_batch(ranks):
    for key, first in ranks[0]["sync_batch_norm"].items():
        bound = BOUNDS[key.split("-")[0]]
        momentum = None if key.endswith("None") else float(key.rsplit("-", 1)[1])
        reference = torch.nn.BatchNorm2d(first["x"].shape[1], momentum=momentum).to(
            torch.float64 if first["x"].dtype == torch.float64 else torch.float32)
        with torch.no_grad():
            reference.weight.copy_(first["initial_state"]["weight"])
            reference.bias.copy_(first["initial_state"]["bias"])
        x = first["x"].clone().requires_grad_()
        output = reference(x)
        output.backward(first["grad_output"])
        seen = [rank["sync_batch_norm"][key] for rank in ranks]
        assert [rank["output"].shape[0] for rank in seen] == first["sizes"]
        _close(torch.cat([rank["output"] for rank in seen]), output.detach(), bound, f"{key} output")
        _close(torch.cat([rank["grad_input"] for rank in seen]), x.grad, bound, f"{key} grad_input")
        # Weight and bias gradients stay per rank (DDP averages them): their sum is the whole batch's.
        _close(sum(rank["grad_weight"].double() for rank in seen), reference.weight.grad, bound, f"{key} grad_weight")
        _close(sum(rank["grad_bias"].double() for rank in seen), reference.bias.grad, bound, f"{key} grad_bias")
        for rank in seen:
            for name, value in reference.state_dict().items():
                if value.is_floating_point():
                    _close(rank["state"][name], value, bound, f"{key} {name}")
                else:
                    assert torch.equal(rank["state"][name], value), f"{key} {name}"


def test_ddp_training_with_sync_batch_norm_equals_one_process(ranks):
    world = len(ranks)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 6, 3, bias=False), torch.nn.BatchNorm2d(6), torch.nn.ReLU(),
                                torch.nn.Flatten(), torch.nn.Linear(6 * 6 * 6, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(3)
    losses = []
    for _ in ranks[0]["ddp"]["losses"]:
        x = torch.randn(4 * world, 3, 8, 8, generator=generator)
        labels = torch.randint(0, 4, (4 * world,), generator=generator)
        loss = torch.nn.functional.cross_entropy(model(x), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    for rank in ranks:
        assert rank["ddp"]["losses"] == pytest.approx(losses, rel=1e-5)
        for name, value in model.state_dict().items():
            if value.is_floating_point():
                _close(rank["ddp"]["state"][name], value, 1e-4, name)
            else:
                assert torch.equal(rank["ddp"]["state"][name], value), name


def test_sharded_row_norm_weight_gradients_sum_to_one_process(ranks):
    generator = torch.Generator().manual_seed(11)
    x = torch.randn(7, 24, generator=generator) * 2 + 0.5
    grad = torch.randn(7, 24, generator=generator)
    for name, module in (("rms_norm", ipt.RMSNorm(24)), ("layer_norm", ipt.LayerNorm(24))):
        module(x).backward(grad)
        for parameter_name, parameter in module.named_parameters():
            for rank in ranks:
                _close(rank["sharded"][f"{name}.{parameter_name}"], parameter.grad, 2e-6,
                       f"{name}.{parameter_name}")


def test_sync_batch_norm_refuses_a_channel_mismatch_on_every_rank(ranks):
    """SyncBatchNorm(2) on 3 channels inside a group raises torch's error on every rank before any collective (no
    rank waits for another), and writes nothing (issue 55: it ran, reading past its parameters)."""
    if TORCH_ERRORS_CRASH:
        pytest.skip(TORCH_ERRORS_CRASH_REASON)
    for rank in ranks:
        refusal = rank["refusal"]
        assert refusal["error"] == "RuntimeError", refusal
        assert "should contain 3 elements not 2" in refusal["message"] and refusal["unchanged"], refusal


def test_sync_batch_norm_refuses_double_backward_on_every_rank(ranks):
    """A backward with create_graph=True raises on every rank (no rank waits in an all_reduce): its gradients could
    not be differentiated again, and a gradient penalty taken as torch.autograd.grad(penalty, parameters) would
    have skipped the layer's second-order terms without a word."""
    if TORCH_ERRORS_CRASH:
        pytest.skip(TORCH_ERRORS_CRASH_REASON)
    for rank in ranks:
        refusal = rank["double_backward"]
        assert refusal["error"] == "RuntimeError" and "no double backward" in refusal["message"], refusal


def test_sync_batch_norm_without_a_process_group_is_batch_norm():
    """Outside an initialized process group (and so with world size 1) SyncBatchNorm is BatchNorm, on the CPU
    too (torch's refuses CPU tensors only where it synchronizes)."""
    torch.manual_seed(1)
    theirs, ours = torch.nn.BatchNorm2d(4), ipt.SyncBatchNorm(4)
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(3, 4, 5, 5)
    for module in (theirs, ours):
        module(x.clone().requires_grad_()).square().sum().backward()
    torch.testing.assert_close(ours.running_mean, theirs.running_mean)  # this library's forward: to rounding
    torch.testing.assert_close(ours.running_var, theirs.running_var)
    torch.testing.assert_close(ours.weight.grad, theirs.weight.grad)
    converted = ipt.SyncBatchNorm.convert_sync_batchnorm(torch.nn.Sequential(torch.nn.BatchNorm1d(3)))
    assert type(converted[0]) is ipt.SyncBatchNorm
    assert list(converted.state_dict()) == list(torch.nn.Sequential(torch.nn.BatchNorm1d(3)).state_dict())


def test_sync_batch_norm_constructor_is_torchs():
    """The same parameters and buffers as torch.nn.SyncBatchNorm's for the same arguments, bias=False included
    (torch before 2.12 has no `bias` argument: then neither has ours)."""
    torch_takes_bias = "bias" in inspect.signature(torch.nn.SyncBatchNorm).parameters
    for arguments in ({}, {"bias": False}, {"affine": False}, {"track_running_stats": False}):
        if "bias" in arguments and not torch_takes_bias:
            with pytest.raises(TypeError, match="bias"):
                ipt.SyncBatchNorm(5, **arguments)
            continue
        theirs, ours = torch.nn.SyncBatchNorm(5, **arguments), ipt.SyncBatchNorm(5, **arguments)
        assert {name: value.shape for name, value in ours.state_dict().items()} == \
            {name: value.shape for name, value in theirs.state_dict().items()}, arguments
