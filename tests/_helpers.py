"""Shared test helpers: dtype/tolerance tables, float64 references, input makers, strided-view makers.

The references here are written from design.md section 2 independently of the package;
test_torch_crosscheck.py checks them against torch autograd.
"""

import ml_dtypes
import numpy as np

F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
BF16 = np.dtype(ml_dtypes.bfloat16)
F64 = np.dtype(np.float64)
SUPPORTED_DTYPES = (F16, F32, BF16)

# Contract accuracy bound: max|err| / max|ref| per output, per dtype (F64: the ...Ex entry points only).
TOLERANCE = {F32: 5e-5, F16: 2e-3, BF16: 1.6e-2, F64: 1e-12}

# infiniStatus_t values (native/include/infinicore.h).
SUCCESS = 0
BAD_PARAM = 3
NULL_POINTER = 4
DEVICE_TYPE_NOT_SUPPORTED = 5
DEVICE_NOT_FOUND = 6
BAD_TENSOR_DTYPE = 10
BAD_TENSOR_SHAPE = 11
BAD_TENSOR_STRIDES = 12
INSUFFICIENT_WORKSPACE = 13

# infiniDtype_t values of the numpy dtypes the tests use.
DTYPE_ENUM = {
    np.dtype(np.int8): 3,
    np.dtype(np.int16): 4,
    np.dtype(np.int32): 5,
    np.dtype(np.int64): 6,
    np.dtype(np.uint8): 7,
    F16: 12,
    F32: 13,
    np.dtype(np.float64): 14,
    BF16: 19,
}

LAYER_NORM_EPS = 1e-5


def contiguous_strides(shape):
    """Row-major element strides."""
    return tuple(int(np.prod(shape[i + 1:], dtype=np.int64)) for i in range(len(shape)))


def f64(a):
    return np.asarray(a, dtype=np.float64)


def relative_error(actual, reference):
    """max|actual - reference| / max|reference|; 0 for empty arrays, absolute error when reference == 0."""
    actual = f64(actual)
    reference = f64(reference)
    assert actual.shape == reference.shape, (actual.shape, reference.shape)
    if reference.size == 0:
        return 0.0
    scale = np.max(np.abs(reference))
    err = np.max(np.abs(actual - reference))
    return float(err / scale) if scale > 0 else float(err)


def assert_close_on_scale(actual, reference, dtype, scale, what):
    """max|err| <= bound * scale: for outputs that are (near) zero by cancellation, where max|ref| is only
    rounding noise, the natural scale is that of the terms that cancel. An exact value at the edge of the
    dtype's finite range or beyond rounds to the largest finite value or to +-inf (F16 rows normalized with
    another row's statistics reach 1e5): there the output must have its sign and be at least that large."""
    actual, reference = f64(actual), f64(reference)
    bound = TOLERANCE[np.dtype(dtype)]
    edge = float(ml_dtypes.finfo(dtype).max) * (1 - 2 * bound)
    beyond = np.abs(reference) > edge
    assert np.all((np.sign(actual) == np.sign(reference))[beyond] & (np.abs(actual) >= edge)[beyond]), (
        f"{what} ({np.dtype(dtype).name}): an exact value beyond the finite range did not round to the edge")
    err = float(np.max(np.abs(actual - reference)[~beyond], initial=0.0))
    assert err <= bound * scale, f"{what} ({np.dtype(dtype).name}): max|err| = {err:.3g} > {bound:g} * {scale:.3g}"


def assert_close(actual, reference, dtype, what):
    bound = TOLERANCE[np.dtype(dtype)]
    err = relative_error(actual, reference)
    assert err <= bound, f"{what} ({np.dtype(dtype).name}): max|err|/max|ref| = {err:.3g} > {bound:g}"


# ---------------------------------------------------------------- float64 references (design.md section 2)

def rms_norm_backward_reference(grad_y, x, w):
    grad_y, x, w = f64(grad_y), f64(x), f64(w)
    d = x.shape[-1]
    if x.size == 0:
        return np.zeros(x.shape), np.zeros(d)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True))
        dot = np.sum(grad_y * w * x, axis=-1, keepdims=True)
        grad_x = r * (grad_y * w) - r**3 * x * dot / d
        grad_w = np.sum((grad_y * x * r).reshape(-1, d), axis=0)
    return grad_x, grad_w


def layer_norm_backward_reference(grad_output, weight, xhat, std):
    go, w, xhat, std = f64(grad_output), f64(weight), f64(xhat), f64(std)
    length = go.shape[-1]
    if go.size == 0:
        return np.zeros(go.shape), np.zeros(length), np.zeros(length)
    g = go * w
    grad_input = (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True)) / std[..., None]
    grad_weight = (go * xhat).reshape(-1, length).sum(0)
    grad_bias = go.reshape(-1, length).sum(0)
    return grad_input, grad_weight, grad_bias


def batch_norm_statistics(mean, var, eps=0.0, save_mean=None, save_invstd=None, training=True):
    """(mean, invstd) the backward uses: the saved ones in training when given, else the running ones."""
    if training and save_mean is not None:
        return f64(save_mean), f64(save_invstd)
    with np.errstate(divide="ignore"):
        return f64(mean), 1.0 / np.sqrt(f64(var) + eps)


def batch_norm_backward_reference(x, grad_output, weight, mean, var, eps=0.0, save_mean=None, save_invstd=None,
                                  training=True):
    """x of shape (N, C, *spatial); weight None: ones (no affine). training=False: the statistics are constants."""
    x, go = f64(x), f64(grad_output)
    c = x.shape[1]
    per_channel = (1, c) + (1,) * (x.ndim - 2)
    reduced = (0,) + tuple(range(2, x.ndim))
    m = x.size // c if c else 0
    mean, inv = (v.reshape(per_channel) for v in batch_norm_statistics(mean, var, eps, save_mean, save_invstd,
                                                                       training))
    w = (np.ones(c) if weight is None else f64(weight)).reshape(per_channel)
    xhat = (x - mean) * inv
    sum_go = go.sum(axis=reduced)
    sum_go_xhat = (go * xhat).sum(axis=reduced)
    if not training:
        return go * w * inv, sum_go_xhat, sum_go
    if m == 0:
        return np.zeros(x.shape), sum_go_xhat, sum_go
    grad_input = w * inv * (go - sum_go.reshape(per_channel) / m - xhat * sum_go_xhat.reshape(per_channel) / m)
    return grad_input, sum_go_xhat, sum_go


def batch_norm_summed_terms(x, grad_output, mean, invstd):
    """(grad_output * xhat, grad_output), each (N * spatial, C): the terms grad_weight and grad_bias sum."""
    x, go = f64(x), f64(grad_output)
    c = x.shape[1]
    per_channel = (1, c) + (1,) * (x.ndim - 2)
    xhat = (x - f64(mean).reshape(per_channel)) * f64(invstd).reshape(per_channel)
    return tuple(np.moveaxis(t, 1, -1).reshape(-1, c) for t in (go * xhat, go))


# ---------------------------------------------------------------- float64 references of the Ex row norms, over k dims

def rms_reference(grad_y, x, w, eps=0.0, rstd=None):
    """(grad_x, grad_w, r) of RMSNorm normalized over w.ndim trailing dims; r from rstd when given."""
    grad_y, x, w = f64(grad_y), f64(x), f64(w)
    k = w.ndim
    axes = tuple(range(x.ndim - k, x.ndim))
    d = int(np.prod(w.shape))
    if rstd is None:
        r = 1.0 / np.sqrt(np.mean(x * x, axis=axes, keepdims=True) + eps)
    else:
        r = f64(rstd).reshape(x.shape[:x.ndim - k] + (1,) * k)
    dot = np.sum(grad_y * w * x, axis=axes, keepdims=True)
    grad_x = r * grad_y * w - r**3 * x * dot / d
    grad_w = np.sum((grad_y * x * r).reshape((-1,) + w.shape), axis=0)
    return grad_x, grad_w, r


def layer_norm_reference(grad_output, weight, xhat, std):
    """(grad_input, grad_weight, grad_bias) normalized over the dims after std's; weight None: ones."""
    go, xhat, std = f64(grad_output), f64(xhat), f64(std)
    leading = std.ndim
    axes = tuple(range(leading, go.ndim))
    w = np.ones(go.shape[leading:]) if weight is None else f64(weight)
    g = go * w
    expand = std.reshape(std.shape + (1,) * len(axes))
    grad_input = (g - g.mean(axes, keepdims=True) - xhat * (g * xhat).mean(axes, keepdims=True)) / expand
    grad_weight = (go * xhat).reshape((-1,) + go.shape[leading:]).sum(0)
    grad_bias = go.reshape((-1,) + go.shape[leading:]).sum(0)
    return grad_input, grad_weight, grad_bias


# ---------------------------------------------------------------- float64 references of the forwards

def rms_norm_forward_reference(x, w, eps):
    """(y, rstd) in float64 from the exact (rounded) inputs, normalized over w's dims."""
    x, w = f64(x), f64(w)
    axes = tuple(range(x.ndim - w.ndim, x.ndim))
    with np.errstate(divide="ignore", invalid="ignore"):
        rstd = 1.0 / np.sqrt(np.mean(x * x, axis=axes, keepdims=True) + eps)
    return x * rstd * w, rstd.reshape(x.shape[:x.ndim - w.ndim])


def layer_norm_forward_reference(x, w, b, normalized, eps):
    """(y, mean, rstd, xhat, std) in float64 from the exact (rounded) inputs, over the last `normalized` dims."""
    x = f64(x)
    axes = tuple(range(x.ndim - normalized, x.ndim))
    lead = x.shape[:x.ndim - normalized]
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = np.mean(x, axis=axes, keepdims=True)
        std = np.sqrt(np.mean((x - mean) ** 2, axis=axes, keepdims=True) + eps)
        xhat = (x - mean) / std
    y = xhat * (1.0 if w is None else f64(w)) + (0.0 if b is None else f64(b))
    return y, mean.reshape(lead), (1.0 / std).reshape(lead), xhat, std.reshape(lead)


def batch_norm_forward_reference(x, weight, bias, running_mean, running_var, training, momentum, eps):
    """(y, mean, invstd, new running_mean, new running_var) in float64 from the exact inputs."""
    x = f64(x)
    channels = x.shape[1]
    per_channel = (1, channels) + (1,) * (x.ndim - 2)
    axes = (0,) + tuple(range(2, x.ndim))
    count = x.size // max(channels, 1)
    new_mean = new_var = None
    if training:
        mean, var = x.mean(axis=axes), x.var(axis=axes)
        if running_mean is not None:
            new_mean = (1 - momentum) * f64(running_mean) + momentum * mean
            new_var = (1 - momentum) * f64(running_var) + momentum * var * count / (count - 1)
    else:
        mean, var = f64(running_mean), f64(running_var)
    invstd = 1.0 / np.sqrt(var + eps)
    w = np.ones(channels) if weight is None else f64(weight)
    b = np.zeros(channels) if bias is None else f64(bias)
    y = (x - mean.reshape(per_channel)) * (invstd * w).reshape(per_channel) + b.reshape(per_channel)
    return y, mean, invstd, new_mean, new_var


# ---------------------------------------------------------------- inputs (already rounded to dT)

def negative_views(torch, tensor):
    """Two stride-2 views equal to ``tensor``: without the negative bit, and with it (its memory holds -tensor)."""
    zeros = torch.zeros_like(tensor)
    plain = torch.view_as_real(torch.complex(zeros, tensor))[..., 1]
    negative = torch.complex(zeros, -tensor).conj().imag
    assert negative.is_neg() and not plain.is_neg() and plain.stride() == negative.stride()
    return plain, negative


def rounded(values, dtype):
    return np.asarray(values, dtype=np.float64).astype(dtype)


def at_vector_offset(values, offset, alignment=16):
    """A C-contiguous copy of `values` whose first element sits `offset` bytes (0 <= offset < alignment) past an
    `alignment`-byte boundary: kernels load 16-byte vectors only from aligned bases, so an offset reaches their
    element-wise paths (on a device too: _devices keeps the offset); the CPU streams stores only to 64-byte aligned
    outputs."""
    values = np.ascontiguousarray(values)
    buffer = np.empty(values.nbytes + 2 * alignment, np.uint8)
    start = offset + (-buffer.ctypes.data) % alignment
    copy = buffer[start:start + values.nbytes].view(values.dtype).reshape(values.shape)
    copy[...] = values
    return copy


def empty_padded_rows(leading, dim, padded, dtype, offset=0):
    """Rows of `dim` elements `padded` apart (zeros), starting `offset` bytes past a 16-byte boundary: an output
    laid out as padded inputs are, so that every tensor of a call keeps 16-byte row strides."""
    return at_vector_offset(np.zeros(leading + (padded,), dtype), offset)[..., :dim]


# Rows one stride apart, D <= 16384: on CUDA the packed kernels. Under 512 a group of 4-32 lanes of a warp a row, one
# or two vectors a lane (16 bytes of 16-bit data, 32 of F32), a warp's groups meeting at each butterfly even where
# some are past the last row; from 512 a CTA a row, 8 elements a thread up to D = 8192, past it two such vectors a
# thread; the next row loading through this one's reductions (RMSNorm's one, LayerNorm's two). (leading dims, D,
# padded row length): each short-row shape (D = 24, 64, 100: 4, 8 and 16 lanes; 256 and 264: a warp, one and two
# vectors a lane; 500) with more rows than the emulation's grid of 8 CTAs takes at once and a last warp only partly
# used, then from the least D to the most of each CTA-a-row kernel, and rows that end inside a vector (D = 100 in rows
# of 104, 500 in 504 and 1001 in 1008, so they still start 16 bytes apart; D = 8200: one thread's second vector alone
# in the row). Past 16384: the long-row kernel. D = 64 in rows of 80: on the CPU, F32 short rows read in place a
# stride apart.
PACKED_ROWS = [((1100,), 24, 24), ((7, 43), 64, 64), ((50,), 64, 80), ((130,), 100, 104), ((70,), 256, 256),
               ((9, 13), 264, 264), ((3, 30), 500, 504), ((67,), 512, 512), ((4, 10), 1000, 1000), ((33,), 1001, 1008),
               ((3, 5), 4104, 4104), ((24,), 8192, 8192), ((9,), 8200, 8200), ((12,), 16384, 16384)]
# (data, parameters): 16-bit data with parameters of its own dtype and of F32; F32 data.
PACKED_DTYPES = [(F16, "data"), (F16, F32), (BF16, "data"), (BF16, F32), (F32, "data")]


def rms_norm_inputs(rng, shape, dtype, positive=False):
    """(grad_y, x, w). positive=True: all-positive data so sums grow linearly (exposes dT accumulation)."""
    d = shape[-1]
    if positive:
        grad_y = rng.uniform(0.0, 1.0, shape)
        x = rng.uniform(0.5, 1.5, shape)
        w = rng.uniform(0.5, 1.5, d)
    else:
        grad_y = rng.standard_normal(shape)
        x = rng.standard_normal(shape)
        w = rng.normal(1.0, 0.5, d)
    return rounded(grad_y, dtype), rounded(x, dtype), rounded(w, dtype)


def layer_norm_inputs(rng, shape, dtype, positive=False):
    """(grad_output, weight, xhat, std) with xhat, std made from a random x with LAYER_NORM_EPS."""
    length = shape[-1]
    row_scale = rng.uniform(0.5, 3.0, shape[:-1] + (1,))
    x = rng.standard_normal(shape) * row_scale + rng.uniform(-2, 2, shape[:-1] + (1,))
    if length > 0:
        mean = x.mean(-1, keepdims=True)
        std = np.sqrt(x.var(-1, keepdims=True) + LAYER_NORM_EPS)
        xhat = (x - mean) / std
    else:
        std = np.ones(shape[:-1] + (1,))
        xhat = x
    grad_output = rng.uniform(0.0, 1.0, shape) if positive else rng.standard_normal(shape)
    weight = rng.normal(1.0, 0.5, length)
    return rounded(grad_output, dtype), rounded(weight, dtype), rounded(xhat, dtype), rounded(std[..., 0], dtype)


def batch_norm_inputs(rng, shape, dtype, positive=False, parameter_dtype=None):
    """(x, grad_output, weight, running_mean, running_var) for x of shape (N, C, *spatial): mean/var are the
    batch statistics of the rounded x. weight, mean and var are in parameter_dtype (default: dtype)."""
    c = shape[1]
    per_channel = (1, c) + (1,) * (len(shape) - 2)
    reduced = (0,) + tuple(range(2, len(shape)))
    x = rng.standard_normal(shape) * rng.uniform(0.5, 3.0, per_channel) + rng.uniform(-2, 2, per_channel)
    x = rounded(x, dtype)
    if c and x.size // c > 0:
        mean = f64(x).mean(axis=reduced)
        var = f64(x).var(axis=reduced)
    else:
        mean, var = np.zeros(c), np.ones(c)
    grad_output = rng.uniform(0.0, 1.0, shape) if positive else rng.standard_normal(shape)
    weight = rng.normal(1.0, 0.5, c)
    parameter_dtype = dtype if parameter_dtype is None else parameter_dtype
    return (x, rounded(grad_output, dtype), rounded(weight, parameter_dtype), rounded(mean, parameter_dtype),
            rounded(var, parameter_dtype))


# ---------------------------------------------------------------- strided views with the same values

ROW_LAYOUTS = ("contiguous", "padded", "reversed")          # valid for inputs and outputs
INPUT_ROW_LAYOUTS = ROW_LAYOUTS + ("broadcast",)            # broadcast: inputs only
VECTOR_LAYOUTS = ("contiguous", "stride2", "reversed")      # outputs with no stride rule (grad_w, ...)
FREE_LAYOUTS = VECTOR_LAYOUTS + ("broadcast",)             # inputs with no stride rule (w, std, ...)


def _fill_value(dtype):
    return np.array(np.nan, dtype=np.float64).astype(dtype)


def padded_buffer_view(shape, dtype):
    """(view, buffer): a view of `shape` with padded strides on every dim but the last (stride 1)."""
    shape = tuple(shape)
    buf_shape = tuple(2 * s + 1 for s in shape[:-1]) + (shape[-1] + 3,)
    buffer = np.full(buf_shape, _fill_value(dtype))
    index = tuple(slice(0, 2 * s, 2) for s in shape[:-1]) + (slice(1, shape[-1] + 1),)
    return buffer[index], buffer


def with_row_layout(values, layout):
    """An array equal to `values` (except 'broadcast', see below) with the given layout of the leading dims.

    'broadcast' repeats the first row over every leading index (zero strides), so it changes the values:
    always compute references from the returned array."""
    if layout == "contiguous":
        return np.ascontiguousarray(values)
    if layout == "padded":
        view, _ = padded_buffer_view(values.shape, values.dtype)
        view[...] = values
        return view
    if layout == "reversed":
        flipped = tuple(slice(None, None, -1) for _ in values.shape[:-1]) + (slice(None),)
        return np.ascontiguousarray(values[flipped])[flipped]
    if layout == "broadcast":
        if values.size == 0:
            return values
        first_row = values[(0,) * (values.ndim - 1)]
        return np.broadcast_to(first_row, values.shape)
    raise ValueError(layout)


def with_free_layout(values, layout):
    """An array equal to `values` laid out with strides on every dim (for tensors with no stride rule).

    'broadcast' repeats the first element everywhere (all strides zero): compute references from the result."""
    everything = tuple(slice(None, None, -1) for _ in values.shape)
    if layout == "contiguous":
        return np.ascontiguousarray(values)
    if layout == "stride2":
        buffer = np.full(tuple(2 * s + 1 for s in values.shape), _fill_value(values.dtype))
        view = buffer[tuple(slice(0, 2 * s, 2) for s in values.shape)]
        view[...] = values
        return view
    if layout == "reversed":
        return np.ascontiguousarray(values[everything])[everything]
    if layout == "broadcast":
        if values.size == 0:
            return values
        return np.broadcast_to(values[(0,) * values.ndim], values.shape)
    raise ValueError(layout)


class GuardedOutput:
    """A preallocated output view inside a sentinel-filled buffer; checks nothing outside the view was written."""

    SENTINEL = -1234.0  # exactly representable in f16, bf16 and f32

    def __init__(self, shape, dtype, layout):
        shape = tuple(shape)
        dtype = np.dtype(dtype)
        if layout in ("contiguous",):
            self.buffer = np.full(shape, self.SENTINEL, dtype=dtype)
            self.view = self.buffer
        elif layout == "padded":
            self.view, self.buffer = padded_buffer_view(shape, dtype)
            self.buffer[...] = self.SENTINEL
        elif layout == "stride2":
            self.buffer = np.full(2 * shape[0] + 1, self.SENTINEL, dtype=dtype)
            self.view = self.buffer[: 2 * shape[0] : 2]
        elif layout == "reversed":
            self.buffer = np.full(shape, self.SENTINEL, dtype=dtype)
            flipped = tuple(slice(None, None, -1) for _ in shape[:-1]) + (slice(None),)
            self.view = self.buffer[flipped] if len(shape) > 1 else self.buffer[::-1]
        else:
            raise ValueError(layout)

    def assert_only_view_written(self):
        result = self.view.copy()
        self.view[...] = self.SENTINEL
        outside = self.buffer != np.array(self.SENTINEL, dtype=self.buffer.dtype)
        assert not outside.any(), "the operator wrote outside the output view"
        self.view[...] = result


def f16_sequential_sum(terms, axis):
    """Sum with an F16 accumulator, one element after the other: what an F16-accumulating kernel computes."""
    return np.cumsum(np.asarray(terms, dtype=np.float16), axis=axis, dtype=np.float16).take(-1, axis=axis)


# ---------------------------------------------------------------- one table row per operator

class OpCase:
    """What the tests need to know about one operator; tensors are listed in the C descriptor order."""

    # What the fuzzers read of a case, as a ForwardCase has it: the seed create and run, no scalars, and no tensor
    # left out on purpose (a NULL grad_bias comes up among the faults).
    suffix = ""
    scalars = ()
    optional = ()

    def __init__(self, name, class_name, c_name, output_names, input_names, make_inputs, reference,
                 output_shapes, row_tensors, contiguous_tensors):
        self.name = name                          # functional API name
        self.class_name = class_name              # operator class in infiniop_py
        self.c_name = c_name                      # infiniopCreate<c_name>Descriptor, infiniop<c_name>, ...
        self.output_names = output_names
        self.input_names = input_names
        self.make_inputs = make_inputs            # (rng, shape, dtype, positive=False) -> inputs
        self.reference = reference                # (*inputs) -> float64 outputs
        self.output_shapes = output_shapes        # shape of the big tensor -> shapes of the outputs
        self.row_tensors = row_tensors            # tensors whose last dim must be contiguous
        self.contiguous_tensors = contiguous_tensors  # tensors that must be fully contiguous

    @property
    def tensor_names(self):
        return self.output_names + self.input_names

    def __repr__(self):
        return self.name

    def function(self):
        import infiniop_py
        return getattr(infiniop_py, self.name)

    def operator_class(self):
        import infiniop_py
        return getattr(infiniop_py, self.class_name)

    @property
    def ranks(self):
        """The big tensor's ranks the seed create takes."""
        return (3,) if self.contiguous_tensors else (2, 3)

    def tensor_specs(self, shape, normalized, codes):
        """(shape, dtype code) of every tensor, as ForwardCase.tensor_specs (one normalized dim, the data's dtype)."""
        return [(tensor_shape, codes["data"]) for tensor_shape in self.tensor_shapes(shape)]

    def tensor_shapes(self, shape):
        """Shapes of every tensor (descriptor order) for the given big-tensor shape."""
        shape = tuple(shape)
        vector = self.output_shapes(shape)[1]
        shapes = dict(zip(self.output_names, self.output_shapes(shape)))
        for name in self.input_names:
            if name in self.row_tensors or name in self.contiguous_tensors:
                shapes[name] = shape
            elif name == "input_std_deviation":
                shapes[name] = shape[:-1]
            else:
                shapes[name] = vector
        return [shapes[name] for name in self.tensor_names]


RMS_NORM = OpCase(
    "rms_norm_backward", "RMSNormBackward", "RMSNormBackward",
    ("grad_x", "grad_w"), ("grad_y", "x", "w"),
    rms_norm_inputs, rms_norm_backward_reference,
    lambda shape: (shape, (shape[-1],)),
    row_tensors=("grad_x", "grad_y", "x"), contiguous_tensors=())

LAYER_NORM = OpCase(
    "layer_norm_backward", "LayerNormBackward", "LayerNormBackward",
    ("grad_input", "grad_weight", "grad_bias"),
    ("grad_output", "weight", "input_standardization", "input_std_deviation"),
    layer_norm_inputs, layer_norm_backward_reference,
    lambda shape: (shape, (shape[-1],), (shape[-1],)),
    row_tensors=("grad_input", "grad_output", "input_standardization"), contiguous_tensors=())

BATCH_NORM = OpCase(
    "batch_norm_backward", "BatchNormBackward", "BatchNormBackward",
    ("grad_input", "grad_weight", "grad_bias"),
    ("input", "grad_output", "weight", "running_mean", "running_var"),
    batch_norm_inputs, batch_norm_backward_reference,
    lambda shape: (shape, (shape[1],), (shape[1],)),
    row_tensors=(), contiguous_tensors=("grad_input", "input", "grad_output"))

OPS = (RMS_NORM, LAYER_NORM, BATCH_NORM)


class ForwardCase:
    """What the fuzzers need to know about one forward create and the run that goes with it, the seed form or the
    Ex one: its tensors in the C order, each with the part of the big tensor's shape it has and the dtype it shares,
    and the scalar arguments after them."""

    def __init__(self, name, c_name, suffix, tensors, output_names, optional, scalars, ranks):
        self.name = name                  # the key of its rule mirror in _fuzz_checks.CHECKS
        self.c_name = c_name              # infiniopCreate<c_name>Descriptor<suffix> and infiniop<c_name><suffix>;
        self.suffix = suffix              # infiniopGet<c_name>WorkspaceSize and infiniopDestroy<c_name>Descriptor
        self.tensors = tensors            # ((name, shape kind, dtype kind), ...), the kinds as tensor_specs has them
        self.output_names = output_names  # tensors the run writes
        self.optional = optional          # tensors the create takes as NULL
        self.scalars = scalars            # ((the mirror's keyword, C type: "float", "double" or "int"), ...)
        self.ranks = ranks                # the big tensor's ranks the create takes

    @property
    def tensor_names(self):
        return tuple(name for name, _, _ in self.tensors)

    @property
    def any_normalized(self):
        """Whether the create takes any count of normalized trailing dims (the row norms' Ex forms; their seed
        forms normalize the last dim)."""
        return self.suffix == "Ex" and any(kind == "normalized" for _, kind, _ in self.tensors)

    def __repr__(self):
        return self.name

    def tensor_specs(self, shape, normalized, codes):
        """(shape, dtype code) of every tensor for the big tensor's shape with `normalized` trailing dims normalized
        (the row norms), and codes: dtype kind ("data", "parameter", "statistic") -> code."""
        shape = tuple(shape)
        leading = len(shape) - normalized
        shapes = {"full": shape, "normalized": shape[leading:], "leading": shape[:leading], "channel": shape[1:2]}
        return [(shapes[shape_kind], codes[dtype_kind]) for _, shape_kind, dtype_kind in self.tensors]


_Y, _X = ("y", "full", "data"), ("x", "full", "data")
_ROW_STATISTICS = {name: (name, "leading", "statistic") for name in ("mean", "rstd")}
_CHANNEL = {name: (name, "channel", "parameter") for name in ("running_mean", "running_var", "weight", "bias")}
_CHANNEL.update({name: (name, "channel", "statistic") for name in ("save_mean", "save_invstd")})

FORWARD_OPS = (
    ForwardCase("rms_norm", "RMSNorm", "", (_Y, _X, ("w", "normalized", "parameter")), ("y",), (),
                (("epsilon", "float"),), (2, 3)),
    ForwardCase("rms_norm_ex", "RMSNorm", "Ex", (_Y, _ROW_STATISTICS["rstd"], _X, ("w", "normalized", "parameter")),
                ("y", "rstd"), ("rstd",), (("epsilon", "double"),), (1, 2, 3, 4, 5)),
    ForwardCase("layer_norm", "LayerNorm", "",
                (("output", "full", "data"), ("input_standardization", "full", "data"),
                 ("input_std_deviation", "leading", "parameter"), ("input", "full", "data"),
                 ("weight", "normalized", "parameter"), ("bias", "normalized", "parameter")),
                ("output", "input_standardization", "input_std_deviation"),
                ("input_standardization", "input_std_deviation", "bias"), (("eps", "float"),), (2, 3)),
    ForwardCase("layer_norm_ex", "LayerNorm", "Ex",
                (_Y, _ROW_STATISTICS["mean"], _ROW_STATISTICS["rstd"], _X, ("w", "normalized", "parameter"),
                 ("b", "normalized", "parameter")),
                ("y", "mean", "rstd"), ("mean", "rstd", "w", "b"), (("eps", "double"),), (1, 2, 3, 4, 5)),
    ForwardCase("batch_norm", "BatchNorm", "",
                (_Y,) + tuple(_CHANNEL[name] for name in ("running_mean", "running_var")) + (_X,)
                + tuple(_CHANNEL[name] for name in ("weight", "bias")),
                ("y", "running_mean", "running_var"), (), (("momentum", "float"), ("epsilon", "float")), (3,)),
    ForwardCase("batch_norm_ex", "BatchNorm", "Ex",
                (_Y,) + tuple(_CHANNEL[name] for name in ("save_mean", "save_invstd", "running_mean", "running_var"))
                + (_X,) + tuple(_CHANNEL[name] for name in ("weight", "bias")),
                ("y", "save_mean", "save_invstd", "running_mean", "running_var"),
                ("save_mean", "save_invstd", "running_mean", "running_var", "weight", "bias"),
                (("training", "int"), ("momentum", "double"), ("epsilon", "double")), (2, 3, 4, 5)),
)


def _summed_terms(case, name, inputs):
    """The float64 terms (reduced dims first) whose sum is the vector gradient `name`, or None."""
    if case is RMS_NORM and name == "grad_w":
        grad_y, x, _ = (f64(a) for a in inputs)
        r = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True))
        return (grad_y * x * r).reshape(-1, x.shape[-1])
    if case is LAYER_NORM and name in ("grad_weight", "grad_bias"):
        grad_output, _, xhat, _ = (f64(a) for a in inputs)
        terms = grad_output * xhat if name == "grad_weight" else grad_output
        return terms.reshape(-1, terms.shape[-1])
    if case is BATCH_NORM and name in ("grad_weight", "grad_bias"):
        x, grad_output, _, mean, var = inputs
        with np.errstate(divide="ignore"):
            terms = batch_norm_summed_terms(x, grad_output, mean, 1.0 / np.sqrt(f64(var)))
        return terms[0] if name == "grad_weight" else terms[1]
    return None


def _cancelled_term_size(case, name, inputs):
    """The size of the first term of a gradient whose terms cancel: max|grad_output * weight / std| for LayerNorm's
    grad_input (below), max|r * grad_y * w| for RMSNorm's grad_x = r*grad_y*w - r^3*x*sum(grad_y*w*x)/D, whose second term cancels
    the first wholly at D = 1 and can nearly at small D (D = 2 left 3e-3 of terms near 1: F32 rounding of the
    terms was 7e-5 of that); None for other outputs."""
    if case is LAYER_NORM and name == "grad_input" and inputs[0].size > 0:
        # LayerNorm's (g - mean(g) - xhat * mean(g * xhat)) / std, g = grad_output * weight, cancels likewise at
        # small D (D = 3 left 2e-3 of terms near 0.1).
        grad_output, weight, _, std = (f64(a) for a in inputs)
        with np.errstate(divide="ignore", invalid="ignore"):
            return float(np.nanmax(np.abs(grad_output * weight / std[..., None])))
    if case is not RMS_NORM or name != "grad_x" or inputs[1].size == 0:
        return None
    grad_y, x, w = (f64(a) for a in inputs)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True))
        return float(np.nanmax(np.abs(r * grad_y * w)))


def assert_matches_reference(case, outputs, inputs, dtype):
    """Every output of `case` within the dtype's bound of the float64 reference of `inputs`.

    A vector gradient is a sum over many rows; where its terms cancel, max|ref| shrinks below the rounding of
    the terms themselves, so such a sum is judged on the larger of max|ref| and its terms' root-sum-square
    (the typical size of a sum of that many terms)."""
    assert len(outputs) == len(case.output_names)
    for name, actual, expected in zip(case.output_names, outputs, case.reference(*inputs)):
        assert actual.shape == expected.shape, f"{name}: shape {actual.shape} != {expected.shape}"
        terms = _summed_terms(case, name, inputs)
        cancelled = _cancelled_term_size(case, name, inputs)
        if cancelled is not None and np.isfinite(cancelled) and cancelled > 0:
            assert_close_on_scale(actual, expected, dtype, max(float(np.max(np.abs(expected))), cancelled), name)
        elif terms is None or terms.size == 0:
            assert_close(actual, expected, dtype, name)
        else:
            with np.errstate(divide="ignore", invalid="ignore"):
                rss = float(np.nanmax(np.sqrt(np.sum(terms * terms, axis=0))))
            scale = max(float(np.max(np.abs(expected))), rss)
            if np.isfinite(scale) and scale > 0:
                assert_close_on_scale(actual, expected, dtype, scale, name)
            else:
                assert_close(actual, expected, dtype, name)


# ---------------------------------------------------------------- direct C calls through the package's cffi

def native():
    """(ffi, libinfiniop, libinfinirt) as loaded by the package."""
    from infiniop_py._ffi import ffi, libraries

    loaded = libraries()
    return ffi, loaded.op, loaded.rt


def dtype_code(dtype):
    """infiniDtype_t value of a numpy dtype, or the int itself when given a code."""
    return dtype if isinstance(dtype, int) else DTYPE_ENUM[np.dtype(dtype)]


class CTensorDescriptors:
    """Native tensor descriptors for (shape, dtype, strides-or-None) specs, NULL for a None spec;
    destroyed on exit."""

    def __init__(self, specs):
        self.specs = specs
        self.pointers = []

    def __enter__(self):
        ffi, op, _ = native()
        for spec in self.specs:
            if spec is None:
                self.pointers.append(ffi.NULL)
                continue
            shape, dtype, strides = spec
            pointer = ffi.new("infiniopTensorDescriptor_t *")
            c_strides = ffi.NULL if strides is None else ffi.new("ptrdiff_t[]", list(strides))
            status = op.infiniopCreateTensorDescriptor(pointer, len(shape), ffi.new("size_t[]", list(shape)),
                                                       c_strides, dtype_code(dtype))
            assert status == SUCCESS, f"infiniopCreateTensorDescriptor{(shape, dtype, strides)} -> {status}"
            self.pointers.append(pointer[0])
        return self.pointers

    def __exit__(self, *exc_info):
        ffi, op, _ = native()
        for pointer in self.pointers:
            if pointer != ffi.NULL:
                assert op.infiniopDestroyTensorDescriptor(pointer) == SUCCESS


def c_function(case, verb):
    """The C entry point of `case` (an OpCase or a ForwardCase): verb in Create, GetWorkspaceSize, Run, Destroy."""
    _, op, _ = native()
    names = {"Create": f"infiniopCreate{case.c_name}Descriptor{case.suffix}",
             "GetWorkspaceSize": f"infiniopGet{case.c_name}WorkspaceSize",
             "Run": f"infiniop{case.c_name}{case.suffix}",
             "Destroy": f"infiniopDestroy{case.c_name}Descriptor"}
    return getattr(op, names[verb])


def c_create_status(case, c_handle, specs, scalars=()):
    """Status of infiniopCreate<Op>Descriptor[Ex] for tensor specs given in descriptor order, then the scalars."""
    ffi, _, _ = native()
    with CTensorDescriptors(specs) as descriptors:
        desc_ptr = ffi.new("infiniopDescriptor_t *")
        status = c_function(case, "Create")(c_handle, desc_ptr, *descriptors, *scalars)
        if status == SUCCESS:
            assert c_function(case, "Destroy")(desc_ptr[0]) == SUCCESS
    return status


class COperator:
    """A native op descriptor made directly through C from arrays (descriptor order), for run-level tests."""

    def __init__(self, case, c_handle, arrays, strides_from_arrays=True):
        """strides_from_arrays=False: contiguous descriptors (NULL strides), whatever numpy says."""
        ffi, _, _ = native()
        self.case = case
        specs = [(a.shape, a.dtype, tuple(s // a.itemsize for s in a.strides) if strides_from_arrays else None)
                 for a in arrays]
        with CTensorDescriptors(specs) as descriptors:
            desc_ptr = ffi.new("infiniopDescriptor_t *")
            assert c_function(case, "Create")(c_handle, desc_ptr, *descriptors) == SUCCESS
        self.descriptor = desc_ptr[0]
        size = ffi.new("size_t *")
        assert c_function(case, "GetWorkspaceSize")(self.descriptor, size) == SUCCESS
        self.workspace_size = size[0]

    def run(self, workspace, workspace_size, pointers):
        return c_function(self.case, "Run")(self.descriptor, workspace, workspace_size, *pointers, native()[0].NULL)

    def destroy(self):
        assert c_function(self.case, "Destroy")(self.descriptor) == SUCCESS


def data_pointer(array):
    ffi, _, _ = native()
    return ffi.cast("void *", array.ctypes.data)


# Shapes with enough rows / batch that every op wants a workspace for its partial sums.
WORKSPACE_SHAPES = {"rms_norm_backward": (64, 64, 32), "layer_norm_backward": (64, 64, 32),
                    "batch_norm_backward": (64, 4, 512)}


def sentinel_outputs_and_inputs(case, shape, dtype=F32, seed=0):
    """(outputs filled with GuardedOutput.SENTINEL, inputs), each a list in descriptor order."""
    outputs = [np.full(s, GuardedOutput.SENTINEL, dtype) for s in case.output_shapes(shape)]
    return outputs, list(case.make_inputs(np.random.default_rng(seed), shape, dtype))


def untouched(array):
    """Still all GuardedOutput.SENTINEL."""
    return bool((array == np.array(GuardedOutput.SENTINEL, array.dtype)).all())


# ---------------------------------------------------------------- BatchNorm ...Ex through C

BATCH_NORM_EX_TENSORS = ("grad_input", "grad_weight", "grad_bias", "input", "grad_output", "weight", "running_mean",
                         "running_var", "save_mean", "save_invstd")


def channels_last(values):
    """An array equal to `values` (N, C, *spatial) laid out channels-last: C innermost, then the spatial dims,
    then N (NHWC for rank 4)."""
    order = (0,) + tuple(range(2, values.ndim)) + (1,)
    return np.ascontiguousarray(values.transpose(order)).transpose(np.argsort(order))


def with_batch_layout(values, layout):
    """`values` laid out 'channels_first' (row-major) or 'channels_last'."""
    return np.ascontiguousarray(values) if layout == "channels_first" else channels_last(values)


def element_strides(array):
    return tuple(s // array.itemsize for s in array.strides)


def batch_norm_ex_create_status(c_handle, specs, epsilon, training):
    """Status of infiniopCreateBatchNormBackwardDescriptorEx; specs: name -> (shape, dtype, strides) or None."""
    ffi, op, _ = native()
    with CTensorDescriptors([specs.get(name) for name in BATCH_NORM_EX_TENSORS]) as descriptors:
        desc_ptr = ffi.new("infiniopDescriptor_t *")
        status = op.infiniopCreateBatchNormBackwardDescriptorEx(c_handle, desc_ptr, *descriptors, epsilon, training)
        if status == SUCCESS:
            assert op.infiniopDestroyBatchNormBackwardDescriptor(desc_ptr[0]) == SUCCESS
    return status


def batch_norm_ex_workspace_size(c_handle, specs, epsilon, training):
    """Workspace bytes of infiniopCreateBatchNormBackwardDescriptorEx's descriptor for the specs (as above): what the
    backend plans, without any data."""
    ffi, op, _ = native()
    with CTensorDescriptors([specs.get(name) for name in BATCH_NORM_EX_TENSORS]) as descriptors:
        desc_ptr = ffi.new("infiniopDescriptor_t *")
        status = op.infiniopCreateBatchNormBackwardDescriptorEx(c_handle, desc_ptr, *descriptors, epsilon, training)
        assert status == SUCCESS, f"create -> {status}"
    try:
        size = ffi.new("size_t *")
        assert op.infiniopGetBatchNormBackwardWorkspaceSize(desc_ptr[0], size) == SUCCESS
        return size[0]
    finally:
        assert op.infiniopDestroyBatchNormBackwardDescriptor(desc_ptr[0]) == SUCCESS


def run_batch_norm_ex(c_handle, arrays, epsilon=0.0, training=True, ignored=None, pointer=data_pointer):
    """Create (Ex) from the arrays' shapes, dtypes and strides, run (Ex) on them and destroy; returns the run
    status. arrays: name -> array, absent names are NULL descriptors; ignored: name -> array whose pointer is
    passed with a NULL descriptor (it must not be touched); pointer: the data pointer passed for an array (and
    the workspace) on the handle's device."""
    ffi, op, _ = native()
    ignored = ignored or {}
    specs = {name: (a.shape, a.dtype, element_strides(a)) for name, a in arrays.items()}
    with CTensorDescriptors([specs.get(name) for name in BATCH_NORM_EX_TENSORS]) as descriptors:
        desc_ptr = ffi.new("infiniopDescriptor_t *")
        status = op.infiniopCreateBatchNormBackwardDescriptorEx(c_handle, desc_ptr, *descriptors, epsilon, training)
        assert status == SUCCESS, f"create -> {status}"
    descriptor = desc_ptr[0]
    try:
        size = ffi.new("size_t *")
        assert op.infiniopGetBatchNormBackwardWorkspaceSize(descriptor, size) == SUCCESS
        workspace = np.empty(max(size[0], 1), np.uint8)
        pointers = []
        for name in BATCH_NORM_EX_TENSORS:
            array = arrays.get(name, ignored.get(name))
            pointers.append(ffi.NULL if array is None else pointer(array))
        return op.infiniopBatchNormBackwardEx(descriptor, pointer(workspace), size[0], *pointers, ffi.NULL)
    finally:
        assert op.infiniopDestroyBatchNormBackwardDescriptor(descriptor) == SUCCESS


def run_python_with_isa(code, isa):
    """(stdout stripped, stderr) of `python -c code` in a new process with INFINIOP_CPU_ISA=isa (None: unset),
    from the repository root: the library picks its ISA once per process."""
    import os
    import pathlib
    import subprocess
    import sys

    env = dict(os.environ)
    env.pop("INFINIOP_CPU_ISA", None)
    if isa is not None:
        env["INFINIOP_CPU_ISA"] = isa
    result = subprocess.run([sys.executable, "-c", code], env=env, cwd=pathlib.Path(__file__).resolve().parent.parent,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.strip(), result.stderr
