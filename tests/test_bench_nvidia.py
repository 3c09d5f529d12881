"""`bench --device nvidia` (infiniop_py/bench/nvidia.py) where it can be checked without a GPU: the cases compute
the same gradients as the PyTorch calls they are timed against (built on torch CPU tensors here), and a GPU report
makes a table with the GPU's copy bandwidth and no CPU-only lines."""

import pytest

from _helpers import TOLERANCE, F32

torch = pytest.importorskip("torch")

from infiniop_py.bench import cpu as bench, nvidia as bench_nvidia  # noqa: E402


@pytest.mark.parametrize("op,shape", [("rms_norm", (6, 40)), ("layer_norm", (6, 40)), ("batch_norm", (3, 4, 10))])
def test_case_computes_what_torch_computes(cpu_handle, op, shape):
    generator = torch.Generator().manual_seed(0)
    case = bench_nvidia.GpuCase(torch, op, "float32", shape, cpu_handle, "cpu", generator)
    try:
        ours, theirs = case.outputs()
    finally:
        case.close()

    assert ours.shape == theirs.shape == shape
    difference = (ours.double() - theirs.double()).abs().max() / theirs.double().abs().max()
    assert difference <= TOLERANCE[F32], (case.torch_method, float(difference))
    assert case.bytes_moved == 3 * ours.numel() * 4


def test_gpu_report_table():
    results = [{"op": "rms_norm", "dtype": "bfloat16", "shape": [16384, 4096], "ours_s": 2e-4, "torch_s": 5e-4,
                "ours_bandwidth": 3e12 * 0.9, "torch_bandwidth": 3e12 * 0.36}]
    report = {"machine": "GPU under test", "threads": None, "copy_bandwidth": 3e12, "copy_method": "copy method",
              "torch_version": torch.__version__, "functional_overhead_s": None, "results": results}

    table = bench.format_table(report)

    assert "threads" not in table and "functional API" not in table
    assert "GPU under test" in table and "(copy method): 3000.0 GB/s" in table
    row = next(line for line in table.splitlines() if line.startswith("| rms_norm"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[3:] == [f"{2e-4 * 1e3:.3f}", f"{5e-4 * 1e3:.3f}", f"{5e-4 / 2e-4:.2f}x", f"{3e12 * 0.9 / 1e9:.1f}",
                         "0.90", "0.36"]


def test_cases_cover_the_issue_shapes_and_the_large_bf16_ones():
    planned = list(bench_nvidia.cases(["rms_norm", "layer_norm", "batch_norm"], ["bfloat16"], quick=False))

    for shape in bench.ROW_SHAPES + [(16384, 4096), (65536, 1024)]:
        assert ("rms_norm", "bfloat16", shape) in planned and ("layer_norm", "bfloat16", shape) in planned
    for shape in bench.BATCH_SHAPES:
        assert ("batch_norm", "bfloat16", shape) in planned
