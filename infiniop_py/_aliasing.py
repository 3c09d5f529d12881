"""Refusing outputs that share memory with another argument, before the native call does the same
(native/src/common/footprint.h), so that the error can name both tensors."""

from .errors import BadParamError
from ._layout import significant_strides


def byte_range(ref):
    """(lowest, highest) absolute address of the bytes ``ref`` touches, or None for an empty tensor."""
    if ref.data == 0 or 0 in ref.shape:
        return None
    low = high = 0
    for extent, stride in zip(ref.shape, ref.strides):
        reach = stride * (extent - 1)
        if reach < 0:
            low += reach
        else:
            high += reach
    return ref.data + low * ref.itemsize, ref.data + high * ref.itemsize + ref.itemsize - 1


def _intersect(a, b):
    return a is not None and b is not None and a[0] <= b[1] and b[0] <= a[1]


def _same_layout(a, b):
    return (a.data == b.data and a.shape == b.shape and a.itemsize == b.itemsize
            and significant_strides(a.shape, a.strides) == significant_strides(b.shape, b.strides))


def require_no_aliasing(refs, outputs, in_place, workspace=None):
    """BadParamError naming the pair when an output shares a byte with another tensor (unless the two are
    the ``in_place`` pair with one pointer and one layout), or the workspace (address, nbytes) with any.

    ``refs``: name -> TensorRef of the tensors present; ``outputs``: names of the written tensors; ``in_place``: (output, input)."""
    ranges = {name: byte_range(ref) for name, ref in refs.items()}
    if workspace is not None and workspace[1] > 0:
        workspace_range = (workspace[0], workspace[0] + workspace[1] - 1)
        for name, span in ranges.items():
            if _intersect(span, workspace_range):
                raise BadParamError(f"workspace: overlaps {name} in memory; the workspace must be separate memory")
    for output in outputs:
        if output not in ranges:  # an output not asked for
            continue
        for name, span in ranges.items():
            if name == output or not _intersect(ranges[output], span):
                continue
            if {output, name} == set(in_place) and _same_layout(refs[output], refs[name]):
                continue
            hint = (f" (in place, {in_place[0]} must be {in_place[1]} itself: same pointer, same layout)"
                    if {output, name} == set(in_place) else "")
            raise BadParamError(f"{output}: overlaps {name} in memory; an output must not share memory with "
                                f"another tensor{hint}")
