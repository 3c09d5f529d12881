"""The drop-in modules against torch.nn's: forward, gradients, running statistics, state_dict, replace_norms."""

import copy
import warnings

import pytest
from hypothesis import given, strategies as st

from _devices import DEVICES
from _torch_helpers import DTYPES, assert_matches_torch, bound, error, float64_twin, forward_backward, torch

import infiniop_py.torch as ipt

PARAMETER_DTYPES = ("same", torch.float32)  # the data's dtype, or F32 parameters with F16/BF16 data


def _seeded(seed):
    return torch.Generator().manual_seed(seed)


def _randn(shape, dtype, generator, scale=1.0, shift=0.0):
    return (torch.randn(shape, generator=generator, dtype=torch.float64) * scale + shift).to(dtype)


def _with_parameters(module, dtype, parameter_dtype, generator):
    """``module`` with random affine parameters, in ``parameter_dtype`` ("same": ``dtype``)."""
    module = module.to(dtype if parameter_dtype == "same" else parameter_dtype)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.copy_(_randn(parameter.shape, parameter.dtype, generator, 0.5, 1.0))
    return module


row_shapes = st.tuples(st.lists(st.integers(1, 5), min_size=0, max_size=2),
                       st.lists(st.integers(1, 130), min_size=1, max_size=2))


@given(shapes=row_shapes, dtype=st.sampled_from(DTYPES), parameter_dtype=st.sampled_from(PARAMETER_DTYPES),
       affine=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_rms_norm_matches_torch(shapes, dtype, parameter_dtype, affine, seed):
    leading, normalized = shapes
    generator = _seeded(seed)
    eps = None if seed % 2 else 1e-6
    theirs = _with_parameters(torch.nn.RMSNorm(normalized, eps=eps, elementwise_affine=affine), dtype,
                              parameter_dtype, generator)
    ours = _with_parameters(ipt.RMSNorm(normalized, eps=eps, elementwise_affine=affine), dtype, parameter_dtype,
                            generator)
    x = _randn((*leading, *normalized), dtype, generator, 2.0, 0.5)
    grad_output = _randn(x.shape, dtype, generator)
    assert_matches_torch(ours, theirs, x, grad_output, _row_scale(theirs, x, grad_output, rms=True))


# Weight dtypes the kernel takes no data with (a narrower weight is widened, an F64 one widens the data).
WIDENED_RMS_NORM_DTYPES = [(torch.float32, torch.bfloat16), (torch.float32, torch.float16),
                           (torch.float32, torch.float64), (torch.bfloat16, torch.float16),
                           (torch.bfloat16, torch.float64), (torch.float16, torch.bfloat16),
                           (torch.float16, torch.float64), (torch.float64, torch.float32),
                           (torch.float64, torch.bfloat16)]


@pytest.mark.parametrize("dtype, weight_dtype", WIDENED_RMS_NORM_DTYPES)
def test_rms_norm_with_weights_of_another_dtype_matches_torch(dtype, weight_dtype):
    """torch runs RMSNorm with any two float dtypes (BF16 weights on F32 data: a model cast to BF16 given F32
    inputs). Ours too: the forward is torch's, bit for bit, and the gradients come in the tensors' own dtypes,
    within the bound of the less precise of the two against a float64 reference, grad_input within its own."""
    generator = _seeded(17)
    theirs = _with_parameters(torch.nn.RMSNorm(40, eps=1e-6), weight_dtype, "same", generator)
    ours = ipt.RMSNorm(40, eps=1e-6).to(weight_dtype)
    ours.load_state_dict(theirs.state_dict())
    x = _randn((5, 3, 40), dtype, generator, 2.0, 0.5)
    grad_output = _randn(x.shape, dtype, generator)  # torch's output takes the data's dtype
    output, grad_x, grads, _ = forward_backward(ours, x, grad_output)
    expected, torch_grad_x, torch_grads, _ = forward_backward(theirs, x, grad_output)
    reference = forward_backward(float64_twin(theirs, dtype), x.double(), grad_output.double())
    assert torch.equal(output, expected) and output.dtype == expected.dtype
    assert grad_x.dtype == dtype and grads["weight"].dtype == weight_dtype
    scale = _row_scale(theirs, x, grad_output, rms=True)
    weight_limit = max(bound(dtype), bound(weight_dtype))
    for what, ours_grad, torch_grad, reference_grad, limit, grad_scale in (
            ("grad_input", grad_x, torch_grad_x, reference[1], bound(dtype), scale),
            ("grad_weight", grads["weight"], torch_grads["weight"], reference[2]["weight"], weight_limit, 0.0)):
        assert error(ours_grad, reference_grad, grad_scale) <= limit, what
        assert error(ours_grad, torch_grad, grad_scale) <= 2 * limit, f"{what} vs torch"


def _row_scale(module, x, grad_output, rms):
    """The size of the terms of a row norm's grad_input: max |grad_output * weight| / min over rows of the
    root mean square (RMSNorm) or standard deviation (LayerNorm) of x."""
    dims = tuple(range(x.dim() - len(module.normalized_shape), x.dim()))
    x = x.double()
    spread = x.square().mean(dims) if rms else x.var(dims, unbiased=False)
    weight = 1.0 if module.weight is None else module.weight.detach().double().abs().max()
    return float(grad_output.double().abs().max() * weight / (spread.min() + 1e-5).sqrt())


@given(shapes=row_shapes, dtype=st.sampled_from(DTYPES), parameter_dtype=st.sampled_from(PARAMETER_DTYPES),
       affine=st.sampled_from(("both", "weight only", "none")), seed=st.integers(0, 2**31 - 1))
def test_layer_norm_matches_torch(shapes, dtype, parameter_dtype, affine, seed):
    leading, normalized = shapes
    generator = _seeded(seed)
    options = {"elementwise_affine": affine != "none", "bias": affine == "both"}
    theirs = _with_parameters(torch.nn.LayerNorm(normalized, **options), dtype, parameter_dtype, generator)
    ours = _with_parameters(ipt.LayerNorm(normalized, **options), dtype, parameter_dtype, generator)
    x = _randn((*leading, *normalized), dtype, generator, 2.0, 1.0)
    grad_output = _randn(x.shape, dtype, generator)
    assert_matches_torch(ours, theirs, x, grad_output, _row_scale(theirs, x, grad_output, rms=False))


@pytest.mark.parametrize("dtype, parameter_dtype", [(torch.float32, "same"), (torch.bfloat16, torch.float32),
                                                     (torch.bfloat16, "same"), (torch.float16, torch.float32)])
@pytest.mark.parametrize("shape, normalized, affine", [((512, 1024), (1024,), "both"), ((2, 64, 48, 64), (48, 64), "both"),
                                                       ((256, 2048), (2048,), "weight only"),
                                                       ((512, 1024), (1024,), "none")])
def test_layer_norm_on_this_librarys_forward_matches_torch(dtype, parameter_dtype, shape, normalized, affine):
    """Shapes large enough for this library's CPU forward (ops._library_layer_norm_serves; smaller ones run
    PyTorch's, the faster there): output within the bound of the float64 reference, gradients as torch's."""
    from infiniop_py.torch import ops

    generator = _seeded(29)
    options = {"elementwise_affine": affine != "none", "bias": affine == "both"}
    theirs = _with_parameters(torch.nn.LayerNorm(normalized, **options), dtype, parameter_dtype, generator)
    ours = _with_parameters(ipt.LayerNorm(normalized, **options), dtype, parameter_dtype, generator)
    x = _randn(shape, dtype, generator, 2.0, 1.0)
    assert ops._library_layer_norm_serves(x, theirs.normalized_shape, theirs.weight, theirs.bias)
    grad_output = _randn(x.shape, dtype, generator)
    assert_matches_torch(ours, theirs, x, grad_output, _row_scale(theirs, x, grad_output, rms=False))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_layer_norm_forward_is_the_librarys_from_its_measured_size_on(dtype):
    """The CPU forward is PyTorch's below ops._LIBRARY_LAYER_NORM_MIN_ELEMENTS (its call costs less there) and this
    library's from there on (16-bit data: at every size); F64 and empty tensors always run PyTorch's."""
    from infiniop_py.torch import ops

    minimum = ops._LIBRARY_LAYER_NORM_MIN_ELEMENTS[dtype]
    weight, bias = torch.ones(256, dtype=dtype), torch.zeros(256, dtype=dtype)
    for rows in sorted({1, max(minimum // 256 - 1, 1), max(minimum // 256, 1), 64}):
        x = torch.zeros(rows, 256, dtype=dtype)
        assert ops._library_layer_norm_serves(x, (256,), weight, bias) is (x.numel() >= minimum), rows
    assert not ops._library_layer_norm_serves(torch.zeros(0, 256, dtype=dtype), (256,), weight, bias)
    assert not ops._library_layer_norm_serves(torch.zeros(max(minimum // 256, 1), 256, dtype=torch.float64), (256,),
                                              weight.double(), bias.double())


@pytest.mark.parametrize("threads", [1, 2, 8])
@pytest.mark.parametrize("norm", ["LayerNorm", "BatchNorm1d"])
def test_small_cpu_inputs_run_torchs_norm_end_to_end(norm, threads, monkeypatch):
    """Below functional._TORCH_BELOW's size, whatever torch's threads, a CPU input runs torch's own norm, forward
    and backward (there the Python around our kernels costs more than they save): torch's autograd
    node and torch's bits, running statistics included. From that size on, ours. The sizes here are set small, for
    the test."""
    from infiniop_py.torch import functional

    op = "layer_norm" if norm == "LayerNorm" else "batch_norm"
    monkeypatch.setattr(functional, "_TORCH_BELOW", {(op, torch.float32): 100})
    generator = _seeded(3)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for rows in (6, 7, 13, 26):  # 96, 112, 208 and 416 elements
            torchs = rows * 16 < 100
            theirs = getattr(torch.nn, norm)(16)
            ours = copy.deepcopy(theirs)
            ipt.replace_norms(ours)
            x = torch.randn(rows, 16, generator=generator, requires_grad=True)
            grad_output = torch.randn(rows, 16, generator=generator)
            results = []
            for module in (theirs, ours):
                x.grad = None
                output = module(x)
                output.backward(grad_output)
                results.append((type(output.grad_fn).__name__, output.detach(), x.grad.clone(),
                                [p.grad for p in module.parameters()], [b.clone() for b in module.buffers()]))
            (stock_node, *stock), (our_node, *our) = results
            assert ("Function" in our_node) is not torchs, (rows, threads, our_node)
            if torchs:
                assert our_node == stock_node
                for a, b in zip(_flat(our), _flat(stock)):
                    assert torch.equal(a, b)
    finally:
        torch.set_num_threads(before)


def _flat(items):
    for item in items:
        yield from (item if isinstance(item, list) else [item])


BATCH_NORMS = {3: (torch.nn.BatchNorm1d, ipt.BatchNorm1d), 4: (torch.nn.BatchNorm2d, ipt.BatchNorm2d),
               5: (torch.nn.BatchNorm3d, ipt.BatchNorm3d)}


@given(batch=st.integers(1, 3), channels=st.integers(1, 9), spatial=st.lists(st.integers(1, 6), max_size=3),
       dtype=st.sampled_from(DTYPES), parameter_dtype=st.sampled_from(PARAMETER_DTYPES),
       channels_last=st.booleans(), training=st.booleans(), affine=st.booleans(),
       track_running_stats=st.booleans(), momentum=st.sampled_from((0.1, None, 0.5)), seed=st.integers(0, 2**31 - 1))
def test_batch_norm_matches_torch(batch, channels, spatial, dtype, parameter_dtype, channels_last, training, affine,
                                  track_running_stats, momentum, seed):
    shape = (batch + 1, channels, *spatial)  # batch statistics need 2+ values per channel
    torch_class, our_class = BATCH_NORMS[max(len(shape), 3)]  # BatchNorm1d takes (N, C) and (N, C, L)
    generator = _seeded(seed)
    options = {"momentum": momentum, "affine": affine, "track_running_stats": track_running_stats}
    theirs = _with_parameters(torch_class(channels, **options), dtype, parameter_dtype, generator)
    ours = _with_parameters(our_class(channels, **options), dtype, parameter_dtype, generator)
    if track_running_stats:  # eval mode normalizes with these
        with torch.no_grad():
            theirs.running_mean.copy_(_randn(channels, theirs.running_mean.dtype, generator, 0.5))
            theirs.running_var.copy_(_randn(channels, theirs.running_var.dtype, generator, 0.2, 1.0).abs() + 0.5)
    theirs.train(training)
    ours.train(training)
    x = _randn(shape, dtype, generator, 2.0, 0.5)
    if channels_last:
        x = x.movedim(1, -1).contiguous().movedim(-1, 1)
    grad_output = _randn(x.shape, dtype, generator)
    assert_matches_torch(ours, theirs, x, grad_output, _channel_scale(theirs, x, grad_output))


def _channel_scale(module, x, grad_output):
    """The size of the terms of BatchNorm's grad_input: max |grad_output * weight| / min over channels of the
    standard deviation (of the batch in training, else the running one)."""
    dims = [0, *range(2, x.dim())]
    if module.training or module.running_var is None:
        variance = x.double().var(dims, unbiased=False)
    else:
        variance = module.running_var.double()
    weight = 1.0 if module.weight is None else module.weight.detach().double().abs().max()
    return float(grad_output.double().abs().max() * weight / (variance.min() + module.eps).sqrt())


@pytest.mark.parametrize("dtype, parameter_dtype", [(torch.float32, "same"), (torch.bfloat16, torch.float32),
                                                     (torch.float16, torch.float32), (torch.float64, "same")])
@pytest.mark.parametrize("shape, channels_last", [((4, 8, 32, 32), False), ((4, 8, 32, 32), True),
                                                  ((2, 16, 4, 16, 16), True), ((512, 64), False)])
@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_on_this_librarys_forward_matches_torch(dtype, parameter_dtype, shape, channels_last, training):
    """Shapes where the CPU forward is this library's (ops._library_batch_norm_serves): output and running
    statistics within the bound of the float64 reference, gradients as torch's."""
    from infiniop_py.torch import ops

    generator = _seeded(23)
    torch_class, our_class = BATCH_NORMS[max(len(shape), 3)]
    theirs = _with_parameters(torch_class(shape[1]), dtype, parameter_dtype, generator)
    ours = _with_parameters(our_class(shape[1]), dtype, parameter_dtype, generator)
    with torch.no_grad():
        theirs.running_mean.copy_(_randn(shape[1], theirs.running_mean.dtype, generator, 0.5))
        theirs.running_var.copy_(_randn(shape[1], theirs.running_var.dtype, generator, 0.2, 1.0).abs() + 0.5)
    theirs.train(training)
    ours.train(training)
    x = _randn(shape, dtype, generator, 2.0, 0.5)
    if channels_last:
        x = x.movedim(1, -1).contiguous().movedim(-1, 1)
    assert ops._library_batch_norm_serves(x, theirs.weight, theirs.bias, theirs.running_mean, theirs.running_var)
    grad_output = _randn(x.shape, dtype, generator)
    assert_matches_torch(ours, theirs, x, grad_output, _channel_scale(theirs, x, grad_output))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("training, running", [(True, True), (True, False), (False, True)])
def test_batch_norm_op_on_this_librarys_forward_gives_the_fakes_dtypes_and_shapes(dtype, training, running):
    """Where the CPU forward is this library's, the custom op's five outputs have the dtypes and shapes of PyTorch's
    (its fake), eval's empty saved statistics included: torch.compile traces with the fake."""
    from infiniop_py.torch import ops

    parameter_dtype = torch.float32 if dtype == torch.bfloat16 else dtype
    x = torch.randn(4, 8, 32, 32).to(dtype)
    weight, bias = torch.rand(8, dtype=parameter_dtype) + 0.5, torch.randn(8, dtype=parameter_dtype)
    statistics = (torch.zeros(8, dtype=parameter_dtype), torch.ones(8, dtype=parameter_dtype)) if running else (None,
                                                                                                               None)
    assert ops._library_batch_norm_serves(x, weight, bias, *statistics)
    ours = torch.ops.infiniop.batch_norm(x, weight, bias, *statistics, training, 0.1, 1e-5)
    theirs = ops._torch_batch_norm(x, weight, bias, *statistics, training, 0.1, 1e-5)
    assert [(t.dtype, t.shape) for t in ours] == [(t.dtype, t.shape) for t in theirs]


def test_batch_norm_running_statistics_over_steps():
    """Ten training steps then eval: running statistics move as torch's, to F32 rounding (this library's forward
    computes them), and num_batches_tracked exactly."""
    generator = _seeded(5)
    for momentum in (0.1, None):
        theirs, ours = torch.nn.BatchNorm2d(4, momentum=momentum), ipt.BatchNorm2d(4, momentum=momentum)
        for _ in range(10):
            x = _randn((3, 4, 5, 5), torch.float32, generator, 2.0, 1.0)
            theirs(x), ours(x)
        for name, value in theirs.state_dict().items():
            torch.testing.assert_close(ours.state_dict()[name], value, rtol=2e-6, atol=1e-7, msg=name)
        assert int(ours.num_batches_tracked) == 10


MODULE_PAIRS = (
    (lambda: torch.nn.RMSNorm((4, 6)), lambda: ipt.RMSNorm((4, 6))),
    (lambda: torch.nn.LayerNorm(6, bias=False), lambda: ipt.LayerNorm(6, bias=False)),
    (lambda: torch.nn.BatchNorm1d(5), lambda: ipt.BatchNorm1d(5)),
    (lambda: torch.nn.BatchNorm2d(5, affine=False), lambda: ipt.BatchNorm2d(5, affine=False)),
    (lambda: torch.nn.BatchNorm3d(5, track_running_stats=False), lambda: ipt.BatchNorm3d(5, track_running_stats=False)),
)


@pytest.mark.parametrize("make_theirs, make_ours", MODULE_PAIRS)
def test_state_dict_round_trips_strictly(make_theirs, make_ours):
    theirs, ours = make_theirs(), make_ours()
    generator = _seeded(3)
    with torch.no_grad():
        for tensor in theirs.state_dict().values():
            if tensor.is_floating_point():
                tensor.copy_(_randn(tensor.shape, tensor.dtype, generator))
    ours.load_state_dict(theirs.state_dict(), strict=True)
    back = make_theirs()
    back.load_state_dict(ours.state_dict(), strict=True)
    for name, value in theirs.state_dict().items():
        assert torch.equal(back.state_dict()[name], value), name
    assert repr(ours) == repr(theirs)
    assert isinstance(ours, type(theirs))


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norms = torch.nn.ModuleList([torch.nn.LayerNorm(8), torch.nn.RMSNorm(8)])
        self.conv = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
        self.sequence = torch.nn.BatchNorm1d(8)
        self.volume = torch.nn.BatchNorm3d(2)


class _CustomLayerNorm(torch.nn.LayerNorm):
    """A subclass with a forward of its own: replace_norms must leave it alone."""


def test_replace_norms_swaps_in_place():
    model = _Block()
    model.custom = _CustomLayerNorm(8)
    parameters_before = list(model.parameters())
    buffers_before = list(model.buffers())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    assert ipt.replace_norms(model) == 5
    assert [type(m) for m in model.norms] == [ipt.LayerNorm, ipt.RMSNorm]
    assert type(model.conv[1]) is ipt.BatchNorm2d and type(model.sequence) is ipt.BatchNorm1d
    assert type(model.volume) is ipt.BatchNorm3d and type(model.custom) is _CustomLayerNorm
    assert all(a is b for a, b in zip(model.parameters(), parameters_before))
    assert all(a is b for a, b in zip(model.buffers(), buffers_before))
    assert ipt.replace_norms(model) == 0  # already ours
    # The optimizer built before the swap trains the swapped modules' parameters.
    weight_before = model.norms[0].weight.detach().clone()
    model.norms[0](torch.randn(2, 8)).square().sum().backward()
    optimizer.step()
    assert not torch.equal(model.norms[0].weight, weight_before)
    assert ipt.replace_norms(torch.nn.LayerNorm(3)) == 1  # the root module itself


def test_replace_norms_keeps_what_it_cannot_serve_with_one_warning():
    model = torch.nn.Sequential(torch.nn.LayerNorm(4), torch.nn.LayerNorm(4), torch.nn.BatchNorm1d(3))
    model[1].bias.data = model[1].bias.data.half()  # parameters of two dtypes
    model[2].to(torch.float8_e4m3fn)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert ipt.replace_norms(model) == 1
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "1 (parameters of several dtypes" in message and "2 (dtype torch.float8_e4m3fn" in message
    assert type(model[0]) is ipt.LayerNorm and type(model[1]) is torch.nn.LayerNorm
    assert type(model[2]) is torch.nn.BatchNorm1d


class _Positive(torch.nn.Module):
    def forward(self, weight):
        return torch.nn.functional.softplus(weight)


@pytest.mark.parametrize("make, shape", [(lambda: torch.nn.RMSNorm(16), (300, 16)),
                                         (lambda: torch.nn.LayerNorm(16), (300, 16)),
                                         (lambda: torch.nn.BatchNorm2d(8), (16, 8, 9, 9))], ids=["rms", "ln", "bn"])
def test_replace_norms_takes_norms_with_a_parametrized_weight(make, shape):
    """torch.nn.utils.parametrize makes a subclass of the module's class; replace_norms left such a module as it
    was, silently (2026-12-08). Now it becomes ours, parametrized as before, and trains as torch's."""
    from torch.nn.utils import parametrize
    theirs = make()
    parametrize.register_parametrization(theirs, "weight", _Positive())
    ours = copy.deepcopy(theirs)
    assert ipt.replace_norms(ours) == 1 and ipt.replace_norms(ours) == 0
    assert isinstance(ours, REPLACED[type(make())]) and parametrize.is_parametrized(ours, "weight")
    assert type(ours).__name__ == type(theirs).__name__ and list(ours.state_dict()) == list(theirs.state_dict())
    x, grad = _randn(shape, torch.float32, _seeded(40)), _randn(shape, torch.float32, _seeded(43))
    results = []
    for module in (ours, theirs):
        input = x.clone().requires_grad_()
        output = module(input)
        output.backward(grad)
        results.append((type(output.grad_fn).__name__, output, input.grad, *(p.grad for p in module.parameters())))
    assert results[0][0] == "CppFunction" != results[1][0]  # our node served
    for got, want in zip(results[0][1:], results[1][1:]):
        assert error(got, want) < 1e-5
    copy.deepcopy(ours)
    parametrize.remove_parametrizations(ours, "weight")
    assert type(ours) is REPLACED[type(make())]


@pytest.mark.parametrize("lazy", [torch.nn.LazyBatchNorm1d, torch.nn.LazyBatchNorm2d, torch.nn.LazyBatchNorm3d])
def test_replace_norms_makes_lazy_batch_norms_ours_when_they_materialize(lazy):
    """A lazy BatchNorm becomes torch's class on its first call; replace_norms left it so, silently (2026-12-08)."""
    shape = {torch.nn.LazyBatchNorm1d: (64, 8), torch.nn.LazyBatchNorm2d: (16, 8, 9, 9),
             torch.nn.LazyBatchNorm3d: (4, 8, 5, 5, 5)}[lazy]
    ours, theirs = lazy(), lazy()
    assert ipt.replace_norms(torch.nn.Sequential(ours)) == 1
    x, grad = _randn(shape, torch.float32, _seeded(41)), _randn(shape, torch.float32, _seeded(43))
    results = []
    for module in (ours, theirs):
        module(x)  # the first call, by the lazy class's forward, makes the parameters
        with torch.no_grad():
            module.weight.copy_(_randn(module.weight.shape, torch.float32, _seeded(42), 0.5, 1.0))
        input = x.clone().requires_grad_()
        output = module(input)
        output.backward(grad)
        results.append((type(output.grad_fn).__name__, output, input.grad, module.weight.grad, module.bias.grad,
                        module.running_mean, module.running_var))
    assert type(ours) is REPLACED[type(theirs)] and ipt.replace_norms(ours) == 0
    assert results[0][0] == "CppFunction" != results[1][0]
    for got, want in zip(results[0][1:], results[1][1:]):
        assert error(got, want) < 1e-5


def test_restore_norms_undoes_replace_norms_for_a_model_pickled_without_this_package():
    """Every kind replace_norms takes goes back to the class it was made as, so a whole-model pickle (torch.save)
    names no class of this package and loads where it is not installed."""
    import io

    from torch.nn.utils import parametrize

    from _foreign_norms import LlamaStyleRMSNorm
    model = torch.nn.Sequential(torch.nn.LayerNorm(8), torch.nn.RMSNorm(8), torch.nn.BatchNorm2d(8),
                                LlamaStyleRMSNorm(8), torch.nn.LazyBatchNorm1d(), torch.nn.LazyBatchNorm1d(),
                                torch.nn.LayerNorm(8))
    parametrize.register_parametrization(model[6], "weight", _Positive())
    original = [type(module) for module in model][:5] + [torch.nn.BatchNorm1d, torch.nn.LayerNorm]
    assert ipt.replace_norms(model, rms_norms=[LlamaStyleRMSNorm]) == 7
    model[5](torch.randn(4, 8, generator=_seeded(44)))  # one lazy module materializes as ours
    assert type(model[5]) is ipt.BatchNorm1d
    assert ipt.restore_norms(model) == 7 and ipt.restore_norms(model) == 0
    assert [type(module) for module in model][:6] == original[:6]
    assert type(model[6]).__bases__ == (torch.nn.LayerNorm,) and parametrize.is_parametrized(model[6], "weight")
    parametrize.remove_parametrizations(model[6], "weight")
    assert type(model[6]) is torch.nn.LayerNorm
    model[4](torch.randn(4, 8, generator=_seeded(45)))
    assert type(model[4]) is torch.nn.BatchNorm1d  # materialized as torch's
    saved = io.BytesIO()
    torch.save(model, saved)
    assert b"infiniop" not in saved.getvalue()


REPLACED = {torch.nn.RMSNorm: ipt.RMSNorm, torch.nn.LayerNorm: ipt.LayerNorm, torch.nn.BatchNorm1d: ipt.BatchNorm1d,
            torch.nn.BatchNorm2d: ipt.BatchNorm2d, torch.nn.BatchNorm3d: ipt.BatchNorm3d}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype, parameter_dtype", [(torch.float32, "same"), (torch.bfloat16, "same"),
                                                    (torch.bfloat16, torch.float32)])
def test_modules_on_each_device(device, dtype, parameter_dtype):
    """Each module on the device's tensors (CUDA: the CUDA backend on torch's current stream) against torch's, with
    parameters in the data's dtype (pure BF16 training) or in F32; LayerNorm on strided rows too (on CUDA with F32
    parameters, which torch refuses, ours runs a packed copy)."""
    torch_device = {"cpu": "cpu", "nvidia": "cuda"}[device]
    generator = _seeded(11)
    x_rows = _randn((6, 40, 96), dtype, generator, 2.0, 0.5).to(torch_device)
    x_images = _randn((4, 8, 9, 9), dtype, generator, 2.0, 0.5).to(torch_device)
    x_strided = _randn((40, 6, 96), dtype, generator, 2.0, 0.5).to(torch_device).transpose(0, 1)
    for make_theirs, make_ours, x in ((lambda: torch.nn.RMSNorm(96), lambda: ipt.RMSNorm(96), x_rows),
                                      (lambda: torch.nn.LayerNorm(96), lambda: ipt.LayerNorm(96), x_rows),
                                      (lambda: torch.nn.LayerNorm(96), lambda: ipt.LayerNorm(96), x_strided),
                                      (lambda: torch.nn.BatchNorm2d(8), lambda: ipt.BatchNorm2d(8), x_images)):
        theirs = _with_parameters(make_theirs(), dtype, parameter_dtype, generator).to(torch_device)
        ours = make_ours().to(torch_device, next(theirs.parameters()).dtype)
        grad_output = _randn(x.shape, dtype, generator).to(torch_device)
        scale = (_channel_scale(theirs, x, grad_output) if x is x_images
                 else _row_scale(theirs, x, grad_output, rms=isinstance(theirs, torch.nn.RMSNorm)))
        # Our BatchNorm forward is PyTorch's native kernel; torch's module would take cuDNN's on CUDA.
        with torch.backends.cudnn.flags(enabled=False):
            computes = _torch_computes(theirs, x)
            assert computes or device != "cpu", f"torch's {type(theirs).__name__} refuses {dtype} on the CPU"
            assert_matches_torch(ours, theirs, x, grad_output, scale, torch_computes=computes)


def _torch_computes(module, x):
    """Whether torch's own module computes on x: torch 2.11's layer_norm refuses BF16 data with F32 parameters on
    CUDA, and then only the float64 reference (on the CPU) judges ours."""
    try:
        with torch.no_grad():
            module(x)
    except RuntimeError:
        return False
    return True
