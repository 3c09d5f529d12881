"""On an NVIDIA GPU, with torch.cuda tensors: stream= in its forms, the functional API ordered on torch's current
stream, and an operator call captured in a CUDA graph. Skips, saying why, where no GPU is usable."""

import numpy as np
import pytest

import infiniop_py
from _devices import DeviceData
from _helpers import F32, RMS_NORM, assert_matches_reference

pytestmark = [pytest.mark.nvidia, pytest.mark.torch_cuda]
SHAPE = (64, 1024)


def _placed(data):
    """(host outputs, host inputs, device arrays in C order) of one RMSNorm case."""
    inputs = list(RMS_NORM.make_inputs(np.random.default_rng(0), SHAPE, F32))
    outputs = [np.zeros(shape, F32) for shape in RMS_NORM.output_shapes(SHAPE)]
    return outputs, inputs, [data.put(a, output=True) for a in outputs] + [data.put(a) for a in inputs]


@pytest.mark.parametrize("form", ["torch stream", "int address"])
def test_operator_runs_on_the_given_stream(form):
    import torch

    data = DeviceData("nvidia")
    outputs, inputs, arrays = _placed(data)
    stream = torch.cuda.Stream()
    with infiniop_py.Handle("nvidia") as handle, infiniop_py.RMSNormBackward(handle, *arrays) as operator:
        operator(*arrays, stream=stream if form == "torch stream" else stream.cuda_stream)
        stream.synchronize()
    data.write_back()
    assert_matches_reference(RMS_NORM, outputs, inputs, F32)


def test_functional_api_is_ordered_on_torchs_current_stream():
    """Inputs written on a torch side stream (which does not wait for the default stream, nor it for them) are
    read only after they are written: the run goes on torch's current stream."""
    import torch

    data = DeviceData("nvidia")
    inputs = list(RMS_NORM.make_inputs(np.random.default_rng(1), SHAPE, F32))
    placed = [data.put(a) for a in inputs]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        written_on_side = [torch.empty_like(t).copy_(t) for t in placed]
        grad_x, grad_w = infiniop_py.rms_norm_backward(*written_on_side)
    side.synchronize()
    assert_matches_reference(RMS_NORM, (data.fetch(grad_x), data.fetch(grad_w)), inputs, F32)


def test_operator_call_captured_in_a_cuda_graph():
    """No allocation and no synchronization inside the call, given a workspace: it can be captured and replayed."""
    import torch

    data = DeviceData("nvidia")
    outputs, inputs, arrays = _placed(data)
    with infiniop_py.Handle("nvidia") as handle, infiniop_py.RMSNormBackward(handle, *arrays) as operator:
        workspace = torch.empty(max(operator.workspace_size, 1), dtype=torch.uint8, device="cuda")
        graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        with torch.cuda.graph(graph, stream=stream):
            operator(*arrays, workspace=workspace, stream=stream)
        graph.replay()
        torch.cuda.synchronize()
    data.write_back()
    assert_matches_reference(RMS_NORM, outputs, inputs, F32)
