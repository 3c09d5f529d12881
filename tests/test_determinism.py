"""Results are bitwise identical between runs, and between OMP_NUM_THREADS=1 and 2."""

import os
import subprocess
import sys

import numpy as np
import pytest

from _helpers import BF16, F32, OPS

# Many rows / a large batch, so that the work splits into several row blocks and partial sums.
SHAPES = {"rms_norm_backward": (3, 1500, 192), "layer_norm_backward": (3, 1500, 192),
          "batch_norm_backward": (48, 6, 700)}
DTYPES = {"f32": F32, "bf16": BF16}
RAW = {2: np.uint16, 4: np.uint32}  # saved as raw bits: np.save cannot store bfloat16 itself

RUN_ALL = """
import sys
import ml_dtypes
import numpy as np
import infiniop_py

directory = sys.argv[1]
dtypes = {"f32": np.float32, "bf16": ml_dtypes.bfloat16}
for line in open(directory + "/cases.txt").read().split():
    op, dtype, count = line.split(":")
    inputs = [np.load(f"{directory}/{op}-{dtype}-{i}.npy").view(dtypes[dtype]) for i in range(int(count))]
    outputs = getattr(infiniop_py, op)(*inputs)
    with open(f"{directory}/{op}-{dtype}.out", "wb") as out:
        out.write(b"".join(np.ascontiguousarray(o).tobytes() for o in outputs))
"""


@pytest.fixture(scope="module")
def saved_inputs(tmp_path_factory):
    directory = tmp_path_factory.mktemp("determinism")
    lines = []
    for case in OPS:
        for dtype_name, dtype in DTYPES.items():
            inputs = case.make_inputs(np.random.default_rng(11), SHAPES[case.name], dtype)
            for i, array in enumerate(inputs):
                np.save(directory / f"{case.name}-{dtype_name}-{i}.npy", array.view(RAW[array.itemsize]))
            lines.append(f"{case.name}:{dtype_name}:{len(inputs)}")
    (directory / "cases.txt").write_text("\n".join(lines))
    return directory


def run_in_subprocess(directory, omp_threads):
    """Run every case in a fresh interpreter; {(op, dtype): output bytes}."""
    env = dict(os.environ, OMP_NUM_THREADS=str(omp_threads))
    subprocess.run([sys.executable, "-c", RUN_ALL, str(directory)], env=env, check=True, timeout=300)
    outputs = {}
    for case in OPS:
        for dtype_name in DTYPES:
            path = directory / f"{case.name}-{dtype_name}.out"
            outputs[case.name, dtype_name] = path.read_bytes()
            path.unlink()
    return outputs


def test_one_and_two_threads_give_identical_bits(saved_inputs):
    one_thread = run_in_subprocess(saved_inputs, 1)
    two_threads = run_in_subprocess(saved_inputs, 2)
    assert one_thread.keys() == two_threads.keys()
    for key in one_thread:
        assert len(one_thread[key]) > 0
        assert one_thread[key] == two_threads[key], f"{key}: OMP_NUM_THREADS=1 and 2 differ"


@pytest.mark.parametrize("case", OPS, ids=str)
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=str)
def test_repeated_runs_give_identical_bits(case, dtype):
    inputs = case.make_inputs(np.random.default_rng(12), SHAPES[case.name], dtype)
    first = [o.copy() for o in case.function()(*inputs)]
    for _ in range(3):
        again = case.function()(*inputs)
        for a, b in zip(first, again):
            assert a.tobytes() == b.tobytes()
