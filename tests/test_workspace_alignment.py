"""A caller's workspace may start at any address: the CPU kernels align what they keep in it themselves
(the sanitizer stage of CI turns any misaligned access into a failure), and results do not depend on it."""

import numpy as np
import pytest

from _helpers import OPS, WORKSPACE_SHAPES, COperator, data_pointer, native, sentinel_outputs_and_inputs


@pytest.mark.parametrize("case", OPS, ids=str)
def test_workspace_at_any_address_gives_the_same_bits(c_handle, case):
    ffi, _, _ = native()
    outputs, inputs = sentinel_outputs_and_inputs(case, WORKSPACE_SHAPES[case.name])
    operator = COperator(case, c_handle, outputs + inputs)
    try:
        buffer = np.zeros(operator.workspace_size + 64, np.uint8)
        results = {}
        for offset in (0, 1, 2, 4, 7, 8, 33, 63):
            fresh = [np.empty_like(o) for o in outputs]
            workspace = ffi.cast("void *", buffer.ctypes.data + offset)
            assert operator.run(workspace, operator.workspace_size, [data_pointer(a) for a in fresh + inputs]) == 0
            results[offset] = b"".join(o.tobytes() for o in fresh)
    finally:
        operator.destroy()
    assert len(set(results.values())) == 1, "results depend on the workspace address"
