"""Fuzzing the create functions with hypothesis: tensor descriptors of ndim 0..9, extents including 0 and values
whose product overflows 64 bits, negative / zero / overlapping / extreme strides, dtype codes that are not
infiniDtype_t values, and NULL in every pointer position. Never a crash; always the status the rules document
(an independent model here for tensor descriptors; the package's rule mirror, _layout, for the ops: the backward
creates and every forward create form, with their scalars drawn, bad ones included). Op descriptors that are
created are also run, on separate buffers covering each footprint."""

from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from infiniop_py import _layout
from _fuzz_checks import (
    HUGE_BROADCAST, INT64_MAX, ITEMSIZE, SIZE_MAX, check_op_create_and_run, check_tensor_create,
    draw_forward_arguments, huge_broadcast_specs,
)
from _helpers import FORWARD_OPS, OPS

HUGE_EXTENTS = (2**31, 2**32 + 1, 2**40, 2**62, INT64_MAX, 2**63, SIZE_MAX)
extents = st.sampled_from((0, 1, 2, 3, 5) * 3 + HUGE_EXTENTS)
small_strides = st.integers(-9, 9)
extreme_strides = st.sampled_from((-(2**63), -(2**62), 2**31, 2**62, INT64_MAX))
dtype_codes = st.sampled_from(sorted(ITEMSIZE) * 3 + [0, 20, 21, 255, 2**31 - 1, 2**32 - 1])
rarely = st.sampled_from([False] * 9 + [True])


@st.composite
def tensor_descriptor_args(draw):
    ndim = draw(st.integers(0, 9))
    shape = draw(st.lists(extents, min_size=ndim, max_size=ndim))
    strides = draw(st.none() | st.lists(st.sampled_from([small_strides] * 4 + [extreme_strides]).flatmap(lambda s: s),
                                        min_size=ndim, max_size=ndim))
    return shape, strides, draw(dtype_codes)


@settings(max_examples=300)
@given(args=tensor_descriptor_args(), null_out=rarely, null_shape=rarely)
@example(args=([0, 2**62, 4], None, 13), null_out=False, null_shape=False)  # contiguous strides overflow
@example(args=([2**62], None, 13), null_out=False, null_shape=False)  # 2**64 bytes
@example(args=([2**61 - 1], None, 13), null_out=False, null_shape=False)  # just fits in bytes
@example(args=([2, 2], [2**62, 1], 1), null_out=False, null_shape=False)  # fits in bytes of one
@example(args=([2, 2], [2**62, 1], 12), null_out=False, null_shape=False)  # but not of two
@example(args=([3, 2], [2**62 - 1, 1], 1), null_out=False, null_shape=False)  # a stride product just under 2**63
@example(args=([3, 2], [2**62, 1], 1), null_out=False, null_shape=False)  # and just over
@example(args=([0, 2**62], [1, 0], 13), null_out=False, null_shape=False)  # an empty dim beside a broadcast one
def test_create_tensor_descriptor_never_crashes_and_returns_the_documented_status(args, null_out, null_shape):
    event(f"status {check_tensor_create(*args, null_out, null_shape)}")


@st.composite
def op_tensor_specs(draw, case):
    """((shape, dtype code, strides or None) per tensor, or None for a NULL descriptor; the scalars). The proper
    shapes for some big tensor of the ranks the create takes (a forward's: also its normalized dims, its dtypes
    by kind, its scalars, and its optional tensors left out now and then), with one kind of fault drawn per
    example so that every verdict comes up: a NULL, a dtype, shapes of any rank 0..9, or strides (small random
    ones: negative, zero, overlapping; or padded)."""
    ndim = draw(st.sampled_from(case.ranks))
    big = tuple(draw(st.lists(st.integers(0, 4), min_size=ndim, max_size=ndim)))
    if case in OPS:
        normalized, codes, scalars = 1, {"data": draw(st.sampled_from([12, 13, 19]))}, ()
    else:
        normalized, codes, scalars = draw_forward_arguments(case, ndim, lambda values: draw(st.sampled_from(values)),
                                                            lambda: draw(st.floats()))
    fault = draw(st.sampled_from(["none", "null", "dtype", "shape", "strides", "strides", "strides", "huge"]))
    if fault == "huge":  # an empty batch beside huge extents, the vectors broadcast (stride 0): no workspace
        big = (0,) + tuple(draw(st.sampled_from(HUGE_BROADCAST)) if i == 1 else 1 for i in range(1, ndim))
        return huge_broadcast_specs(case, big), scalars
    specs = [[shape, code, None] for shape, code in case.tensor_specs(big, normalized, codes)]
    victims = draw(st.sets(st.integers(0, len(specs) - 1), min_size=1, max_size=len(specs)))
    for index in victims:
        shape = specs[index][0]
        if fault == "dtype":
            specs[index][1] = draw(st.sampled_from([1, 5, 12, 13, 14, 18, 19]))
        elif fault == "shape":
            specs[index][0] = tuple(draw(st.lists(st.integers(0, 3), max_size=9)))
        elif fault == "strides":
            kind = draw(st.sampled_from(["random", "padded"]))
            if kind == "random":
                specs[index][2] = tuple(draw(st.lists(small_strides, min_size=len(shape), max_size=len(shape))))
            elif shape:
                specs[index][2] = tuple(2 * s for s in _layout.contiguous_strides(shape))[:-1] + (1,)
    specs = [tuple(spec) for spec in specs]
    if fault == "null":
        specs[min(victims)] = None
    for index, name in enumerate(case.tensor_names):
        if name in case.optional and draw(st.sampled_from([False, False, True])):
            specs[index] = None
    return specs, scalars


def _fuzz_op(case):
    @settings(max_examples=300)
    @given(data=st.data())
    def fuzz(c_handle, data):
        specs, scalars = data.draw(op_tensor_specs(case))
        null_handle = data.draw(rarely) and data.draw(rarely)
        null_out = data.draw(rarely) and data.draw(rarely)
        for label in check_op_create_and_run(case, c_handle, specs, null_handle, null_out, scalars):
            event(label)

    fuzz.__name__ = f"test_fuzz_create_and_run_{case.name}"
    fuzz.__doc__ = (f"infiniopCreate{case.c_name}Descriptor{case.suffix}: returns the documented status for any "
                    f"descriptors and scalars; created ones run.")
    return fuzz


for _case in OPS + FORWARD_OPS:
    globals()[f"test_fuzz_create_and_run_{_case.name}"] = _fuzz_op(_case)


def test_rows_of_no_elements_with_null_data_and_negative_strides(c_handle):
    """Found by the op fuzzer under UBSan: rows of length 0 (their data NULL) must not be stepped through. The
    forwards' too, each create form (their per-row statistics are written: 1/sqrt(eps) and 0)."""
    for case in OPS + FORWARD_OPS:
        if not case.name.startswith("batch_norm"):
            scalars = [1e-5 for _ in case.scalars]
            specs = [(shape, 13, (-1,) * len(shape) if len(shape) == 2 else None)
                     for shape, _ in case.tensor_specs((300, 0), 1, {"data": 13, "parameter": 13, "statistic": 13})]
            assert check_op_create_and_run(case, c_handle, specs, scalars=scalars) == ["create status 0", "ran"]
