"""The CPU benchmark's table (infiniop_py/bench.py): where each result carries the copy bandwidth timed with it, the
fractions are taken against that copy and a column shows it."""

from infiniop_py import bench


def test_cpu_report_table_uses_each_case_copy():
    results = [
        {"op": "rms_norm", "dtype": "float32", "shape": [4096, 4096], "ours_s": 6e-3, "torch_s": 1.5e-1,
         "ours_bandwidth": 30e9, "torch_bandwidth": 1.2e9, "copy_bandwidth": 40e9},
        {"op": "layer_norm", "dtype": "bfloat16", "shape": [1, 1048576], "ours_s": 1e-3, "torch_s": None,
         "ours_bandwidth": 6e9, "torch_bandwidth": None, "copy_bandwidth": 60e9},
    ]
    report = {"machine": "CPU under test", "threads": 2, "copy_bandwidth": 50e9, "copy_method": "copy method",
              "torch_version": "2.13.0", "functional_overhead_s": 3e-6,
              "functional_overheads_s": {"rms_norm": 3e-6}, "results": results}

    lines = bench.format_table(report).splitlines()

    assert lines[0] == "machine: CPU under test; threads: 2; torch 2.13.0" and lines[1] == "copy bandwidth (copy method): 50.0 GB/s"
    header = lines.index("| op | dtype | shape | ours ms | torch ms | speedup | ours GB/s | ours/copy | torch/copy "
                         "| copy GB/s |")
    assert lines[header + 1] == "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[header + 2:header + 4]]
    assert rows == [
        ["rms_norm", "float32", "4096x4096", "6.000", "150.000", "25.00x", "30.0", "0.75", "0.03", "40.0"],
        ["layer_norm", "bfloat16", "1x1048576", "1.000", "-", "-", "6.0", "0.10", "-", "60.0"],
    ]
