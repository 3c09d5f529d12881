"""`bench --device nvidia` (infiniop_py/bench/nvidia.py, nvidia_forward.py, gpu_peers.py) where it can be checked
without a GPU: the cases, backward and forward, compute what the PyTorch calls they are timed against compute (built
on torch CPU tensors here),
a GPU report makes a table with the GPU's copy bandwidth, the peers' columns and no CPU-only lines, and a peer
that cannot run is named with the reason. On a GPU (nvidia-marked): Liger-Kernel's and cuDNN's gradients agree
with torch's, and a quick run reports every column."""

import json
import sys

import pytest

from _helpers import TOLERANCE, BF16, F32

torch = pytest.importorskip("torch")

from infiniop_py.bench import cpu as bench, gpu_peers, main as bench_main, nvidia as bench_nvidia  # noqa: E402
from infiniop_py.bench.nvidia_forward import GpuForwardCase  # noqa: E402


@pytest.mark.parametrize("op,shape,layout,dtype", [
    ("rms_norm", (6, 40), "rows", "float32"), ("layer_norm", (6, 40), "rows", "float32"),
    ("layer_norm_from_input", (6, 40), "rows", "float32"), ("batch_norm", (3, 4, 10), "channels_first", "float32"),
    ("batch_norm", (3, 4, 5, 6), "channels_last", "float32"), ("batch_norm", (3, 4, 5, 6), "channels_last", "bfloat16"),
])
def test_case_computes_what_torch_computes(cpu_handle, op, shape, layout, dtype):
    generator = torch.Generator().manual_seed(0)
    case = bench_nvidia.GpuCase(torch, op, dtype, shape, cpu_handle, "cpu", generator, layout, cudnn=True)
    try:
        outputs = case.outputs()
    finally:
        case.close()

    ours, theirs = outputs["ours"], outputs["torch"]
    assert ours.shape == theirs.shape == shape and ours.stride() == theirs.stride()
    assert bench_nvidia.relative_difference(ours, theirs) <= TOLERANCE[BF16 if dtype == "bfloat16" else F32]
    assert case.bytes_moved == 3 * ours.numel() * ours.element_size()
    if op == "batch_norm":  # the CUDA-only peer says why it has no time here, and is left out of the outputs
        assert case.peers["cudnn_s"] == "cuDNN runs on CUDA tensors only" and set(outputs) == {"ours", "torch"}
        assert case.parameter_dtype == "float32"
    else:
        assert case.phases == {}


FORWARD_CASES = [("rms_norm", (6, 40), "rows", "float32"), ("rms_norm", (6, 40), "rows", "bfloat16"),
                 ("layer_norm", (6, 40), "rows", "float32"), ("layer_norm", (6, 40), "rows", "bfloat16"),
                 ("batch_norm", (3, 4, 10), "channels_first", "float32"),
                 ("batch_norm", (3, 4, 5, 6), "channels_last", "float32"),
                 ("batch_norm", (3, 4, 5, 6), "channels_last", "bfloat16")]


@pytest.mark.parametrize("op,shape,layout,dtype", FORWARD_CASES)
def test_forward_case_computes_what_torch_computes(cpu_handle, op, shape, layout, dtype):
    """Each forward case's y is torch's training forward's (statistics saved, running ones updated), laid out as
    torch lays it out; the bytes are one read and one write; the CUDA-only peers say why they have no time here."""
    generator = torch.Generator().manual_seed(0)
    case = GpuForwardCase(torch, op, dtype, shape, cpu_handle, "cpu", generator, layout, liger=[None, None],
                          cudnn=True)
    try:
        outputs = case.outputs()
        statistics = [t.clone() for t in case._tensors[1:5 if op == "batch_norm" else 2 if op == "rms_norm" else 3]]
    finally:
        case.close()

    ours, theirs = outputs["ours"], outputs["torch"]
    assert ours.shape == theirs.shape == shape and ours.stride() == theirs.stride()
    assert bench_nvidia.relative_difference(ours, theirs) <= TOLERANCE[BF16 if dtype == "bfloat16" else F32]
    assert case.bytes_moved == 2 * ours.numel() * ours.element_size() and case.direction == "forward"
    assert all(torch.isfinite(s).all() for s in statistics)  # written: torch.empty's memory would hold anything
    peer = "cudnn_s" if op == "batch_norm" else "liger_s"
    runs_on = "cuDNN" if op == "batch_norm" else "Liger-Kernel"
    assert case.peers == {peer: f"{runs_on} runs on CUDA tensors only"} and set(outputs) == {"ours", "torch"}
    assert case.phases == {} and case.parameter_dtype == ("float32" if op == "batch_norm" else dtype)


def test_forward_case_row_says_forward(cpu_handle):
    generator = torch.Generator().manual_seed(0)
    case = GpuForwardCase(torch, "layer_norm", "float32", (4, 16), cpu_handle, "cpu", generator)
    try:
        row = bench_nvidia.case_row(case, {"ours_s": 1e-3, "torch_s": 2e-3}, {"ours": 0.0})
    finally:
        case.close()
    assert row["direction"] == "forward" and row["ours_bandwidth"] == 2 * 4 * 16 * 4 / 1e-3
    assert "| layer_norm forward | float32 | 4x16 |" in bench.format_table(_report([row]))
    with pytest.raises(ValueError, match="no forward benchmark of 'layer_norm_from_input'"):
        GpuForwardCase(torch, "layer_norm_from_input", "float32", (4, 16), cpu_handle, "cpu", generator)


@pytest.mark.parametrize("layout", ["channels_first", "channels_last"])
def test_batch_norm_phases_compute_the_one_calls_gradients(cpu_handle, layout):
    """The two timed phases of a BatchNorm case (sums, then grad_input) write what its one call writes."""
    generator = torch.Generator().manual_seed(1)
    case = bench_nvidia.GpuCase(torch, "batch_norm", "float32", (3, 4, 5, 6), cpu_handle, "cpu", generator, layout)
    try:
        case.ours()
        one_call = [tensor.clone() for tensor in case._tensors[:3]]
        for tensor in case._tensors[:3]:
            tensor.fill_(float("nan"))
        case.phases["ours_reduce_s"]()
        case.phases["ours_elementwise_s"]()
    finally:
        case.close()
    assert set(case.phases) == {"ours_reduce_s", "ours_elementwise_s"}
    for got, want in zip(case._tensors[:3], one_call):
        assert bench_nvidia.relative_difference(got, want) <= TOLERANCE[F32]


def test_phase_note_says_where_a_batch_norm_call_goes():
    row = {"op": "batch_norm", "dtype": "bfloat16", "shape": [128, 2048, 7, 7], "layout": "channels_last",
           "ours_s": 40e-6, "ours_bandwidth": 3e9 / 40e-6 / 1e3, "ours_reduce_s": 20e-6, "ours_elementwise_s": 15e-6}
    # 3 MB moved: the sums read 2 MB in 20 us (0.1 TB/s), grad_input moves 3 MB in 15 us (0.2 TB/s); copy 1 TB/s.
    assert bench_nvidia.phase_note(row, 1e12) == (
        "batch_norm bfloat16 128x2048x7x7 NHWC: ours 0.0400 ms = reduce 0.0200 ms (0.10 of copy) + elementwise "
        "0.0150 ms (0.20 of copy) +0.0050 ms")
    assert bench_nvidia.phase_note({**row, "ours_reduce_s": None}, 1e12) is None
    assert bench_nvidia.phase_note({"op": "rms_norm", "ours_s": 1.0}, 1e12) is None


def test_peers_refuse_cpu_tensors_saying_so():
    x = torch.ones(2, 8)
    with pytest.raises(gpu_peers.Unavailable, match="Liger-Kernel runs on CUDA tensors only"):
        gpu_peers.liger_rms_norm_backward(None, x, x, torch.ones(8))
    with pytest.raises(gpu_peers.Unavailable, match="Liger-Kernel runs on CUDA tensors only"):
        gpu_peers.liger_layer_norm_backward(None, x, x, torch.ones(8), 1e-5)
    with pytest.raises(gpu_peers.Unavailable, match="Liger-Kernel runs on CUDA tensors only"):
        gpu_peers.liger_rms_norm_forward(None, x, torch.ones(8), 1e-6)
    with pytest.raises(gpu_peers.Unavailable, match="Liger-Kernel runs on CUDA tensors only"):
        gpu_peers.liger_layer_norm_forward(None, x, torch.ones(8), torch.zeros(8), 1e-5)
    with pytest.raises(gpu_peers.Unavailable, match="cuDNN runs on CUDA tensors only"):
        gpu_peers.cudnn_batch_norm_forward(torch, torch.ones(2, 8, 3), torch.ones(8), torch.zeros(8), 0.1, 1e-5)


def test_missing_liger_kernel_is_a_note_saying_how_to_get_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "liger_kernel", None)  # import fails, as where it is not installed

    with pytest.raises(gpu_peers.Unavailable) as missing:
        gpu_peers.liger_modules()

    assert "pip install liger-kernel" in str(missing.value)
    peers, versions, notes = bench_nvidia.peer_columns(["rms_norm", "batch_norm"], missing.value, "cuDNN 91002")
    assert peers == [["cudnn_s", "cuDNN"]] and versions == ["cuDNN 91002"]
    assert notes == [f"no Liger column: {missing.value}"]
    # A peer of no op asked for is neither a column nor a note.
    assert bench_nvidia.peer_columns(["batch_norm"], missing.value, "cuDNN 91002") == (
        [["cudnn_s", "cuDNN"]], ["cuDNN 91002"], [])


def _report(results, peers=(), notes=()):
    return {"machine": "GPU under test", "threads": None, "copy_bandwidth": 3e12, "copy_method": "copy method",
            "torch_version": torch.__version__, "functional_overhead_s": None, "peers": [list(p) for p in peers],
            "peer_versions": ["Liger-Kernel 0.8.5"] if peers else [], "peer_notes": list(notes), "results": results}


def _cells(table, start):
    row = next(line for line in table.splitlines() if line.startswith(start))
    return [cell.strip() for cell in row.strip("|").split("|")]


def test_gpu_report_table():
    results = [{"op": "rms_norm", "dtype": "bfloat16", "shape": [16384, 4096], "ours_s": 2e-4, "torch_s": 5e-4,
                "ours_bandwidth": 3e12 * 0.9, "torch_bandwidth": 3e12 * 0.36}]

    table = bench.format_table(_report(results))

    assert "threads" not in table and "functional API" not in table and "vs best" not in table
    assert "GPU under test" in table and "(copy method): 3000.0 GB/s" in table
    assert _cells(table, "| rms_norm")[3:] == [f"{2e-4 * 1e3:.3f}", f"{5e-4 * 1e3:.3f}", f"{5e-4 / 2e-4:.2f}x",
                                               f"{3e12 * 0.9 / 1e9:.1f}", "0.90", "0.36"]


def test_gpu_report_table_sets_ours_against_each_peer_and_the_fastest_other():
    results = [
        {"op": "rms_norm", "dtype": "bfloat16", "shape": [4096, 4096], "ours_s": 8e-5, "torch_s": 6e-5,
         "liger_s": 5e-5, "ours_bandwidth": 1.2e12, "torch_bandwidth": 1.6e12},
        {"op": "batch_norm", "dtype": "bfloat16", "shape": [128, 64, 112, 112], "layout": "channels_last",
         "ours_s": 1e-4, "torch_s": 4e-4, "cudnn_s": 2e-4, "ours_bandwidth": 2e12, "torch_bandwidth": 5e11},
        {"op": "rms_norm", "dtype": "float32", "shape": [1, 1048576], "ours_s": 4e-5, "torch_s": 8e-4,
         "liger_s": None, "ours_bandwidth": 3e11, "torch_bandwidth": 1.5e10},
    ]
    peers = [("liger_s", "Liger"), ("cudnn_s", "cuDNN")]

    table = bench.format_table(_report(results, peers, ["no Liger time for rms_norm float32 1x1048576: too long"]))

    lines = table.splitlines()
    assert lines[0].endswith("; Liger-Kernel 0.8.5")
    assert ("| op | dtype | shape | ours ms | torch ms | speedup | Liger ms | vs Liger | cuDNN ms | vs cuDNN | vs best "
            "| ours GB/s | ours/copy | torch/copy |") in lines
    assert _cells(table, "| rms_norm | bfloat16")[3:11] == ["0.080", "0.060", "0.75x", "0.050", "0.62x", "-", "-",
                                                          "0.62x"]
    assert _cells(table, "| batch_norm")[2:11] == ["128x64x112x112 NHWC", "0.100", "0.400", "4.00x", "-", "-",
                                                  "0.200", "2.00x", "2.00x"]
    assert _cells(table, "| rms_norm | float32")[6:11] == ["-", "-", "-", "-", "20.00x"]
    assert "median speedup over Liger: 0.62x; slowest case: 0.62x" in lines
    assert "median speedup over the fastest other: 2.00x; slowest case: 0.62x" in lines
    assert lines[-1] == "no Liger time for rms_norm float32 1x1048576: too long"


def test_cases_cover_the_issue_shapes():
    planned = list(bench_nvidia.cases(["rms_norm", "layer_norm", "batch_norm"], ["bfloat16", "float32"],
                                      quick=False))

    for dtype in ("bfloat16", "float32"):
        for shape in [(4096, 4096), (16384, 4096), (8192, 8192), (2048, 16384), (65536, 1024), (1, 1 << 20)]:
            for op in ("rms_norm", "layer_norm"):
                assert (op, dtype, shape, "rows") in planned
        for shape in [(256, 64, 56, 56), (32, 256, 32, 32), (128, 512, 7, 7)]:
            assert ("batch_norm", dtype, shape, "channels_first") in planned
        for shape in [(128, 64, 112, 112), (128, 2048, 7, 7)]:  # ResNet-50's stem and last stage, batch 128
            assert ("batch_norm", dtype, shape, "channels_last") in planned
    assert len(list(bench_nvidia.cases(["rms_norm", "batch_norm"], ["float32"], quick=True))) == 2


def test_a_peer_that_fails_is_noted_and_the_case_still_reports(cpu_handle, monkeypatch):
    generator = torch.Generator().manual_seed(0)
    case = bench_nvidia.GpuCase(torch, "rms_norm", "float32", (4, 16), cpu_handle, "cpu", generator)
    case.peers["liger_s"] = (lambda: None, None)  # a peer whose capture fails
    case.peers["cudnn_s"] = "cuDNN refuses it"  # and one that could not be built

    def graph_seconds(torch_, call, stream, replays):
        if call is case.peers["liger_s"][0]:
            raise RuntimeError("operation not permitted when stream is capturing\nmore")
        if call is case.theirs:
            raise ValueError()
        return 1e-3

    monkeypatch.setattr(bench_nvidia, "graph_seconds", graph_seconds)
    monkeypatch.setattr(bench_nvidia, "event_seconds", lambda torch_, call, replays: 2e-3)
    notes = []
    try:
        times, differences = bench_nvidia._run_case(torch, case, None, 3, notes)
    finally:
        case.close()

    # torch's time is needed for the row: where its capture fails it is timed eagerly, saying so.
    assert times == {"ours_s": 1e-3, "torch_s": 2e-3} and set(differences) == {"ours"}
    assert notes == ["no cuDNN time for rms_norm float32 4x16: cuDNN refuses it",
                     "rms_norm float32 4x16: torch not captured in a CUDA graph (ValueError); timed eagerly",
                     "no Liger time for rms_norm float32 4x16: operation not permitted when stream is capturing"]
    row = bench_nvidia.case_row(case, times, differences)
    assert row["liger_s"] is None and row["cudnn_s"] is None and row["ours_bandwidth"] == case.bytes_moved / 1e-3
    assert row["torch_bandwidth"] == case.bytes_moved / 2e-3


GPU_CASES = [("rms_norm", (64, 4096), "rows"), ("layer_norm", (64, 1024), "rows"),
             ("batch_norm", (8, 64, 14, 14), "channels_last"), ("batch_norm", (8, 64, 14, 14), "channels_first")]


@pytest.mark.nvidia
@pytest.mark.torch_cuda
@pytest.mark.parametrize("case_class,op,shape,layout",
                         [(bench_nvidia.GpuCase, *case) for case in GPU_CASES]
                         + [(bench_nvidia.GpuCase, "layer_norm_from_input", (64, 1024), "rows")]
                         + [(GpuForwardCase, *case) for case in GPU_CASES])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_peers_compute_what_torch_computes_on_the_gpu(case_class, op, shape, layout, dtype):
    """Backward (GpuCase) and forward (GpuForwardCase): ours and each peer give torch's main output."""
    import infiniop_py as ip

    try:
        liger = list(gpu_peers.liger_modules())[:2]
    except gpu_peers.Unavailable:
        liger = None
    generator = torch.Generator(device="cuda").manual_seed(0)
    with ip.Handle("nvidia", 0) as handle:
        case = case_class(torch, op, dtype, shape, handle, "cuda", generator, layout, torch.cuda.current_stream(),
                          liger, cudnn=True)
        try:
            outputs = case.outputs()
            torch.cuda.synchronize()
        finally:
            case.close()

    tolerance = TOLERANCE[BF16 if dtype == "bfloat16" else F32]
    refused = {key: why for key, why in case.peers.items() if isinstance(why, str)}
    assert not refused or dtype == "bfloat16", refused  # a peer may refuse 16-bit data, saying so; never F32
    assert set(case.peers) == ({"cudnn_s"} if op == "batch_norm" else {"liger_s"} if liger else set())
    assert set(outputs) == {"ours", "torch"} | (set(case.peers) - set(refused))
    for key, value in outputs.items():
        assert bench_nvidia.relative_difference(value, outputs["torch"]) <= tolerance, key


@pytest.mark.nvidia
@pytest.mark.torch_cuda
def test_quick_gpu_run_reports_every_column(tmp_path, capsys):
    path = tmp_path / "gpu.json"

    # F16: cuDNN takes F16 data with F32 parameters, and refuses BF16 with them (torch's cudnn_batch_norm exempts
    # only Half from its same-dtype check), so BF16 would leave the cuDNN column empty.
    assert bench_main(["--device", "nvidia", "--quick", "--ops", "rms_norm", "batch_norm", "--dtypes", "float16",
                       "--repeats", "3", "--json", str(path)]) == 0

    report = json.loads(path.read_text())
    rows = {r["op"]: r for r in report["results"]}
    assert rows["batch_norm"]["cudnn_s"] > 0 and rows["batch_norm"]["layout"] == "channels_first"
    assert all(r["ours_s"] > 0 and r["torch_s"] > 0 and r["max_relative_difference_vs_torch"] < 2e-2
               for r in rows.values())
    assert "vs best" in capsys.readouterr().out and report["timing_method"].startswith("CUDA graph of 10 calls")


@pytest.mark.nvidia
@pytest.mark.torch_cuda
def test_quick_gpu_forward_run_reports_every_op(tmp_path, capsys):
    path = tmp_path / "gpu_forward.json"

    assert bench_main(["--device", "nvidia", "--forward", "--quick", "--dtypes", "bfloat16", "--repeats", "3",
                       "--json", str(path)]) == 0

    report = json.loads(path.read_text())
    assert report["direction"] == "forward" and {r["op"] for r in report["results"]} == {
        "rms_norm", "layer_norm", "batch_norm"}
    assert all(r["direction"] == "forward" and r["ours_s"] > 0 and r["torch_s"] > 0
               and r["max_relative_difference_vs_torch"] < 2e-2 for r in report["results"])
    assert "| batch_norm forward |" in capsys.readouterr().out
