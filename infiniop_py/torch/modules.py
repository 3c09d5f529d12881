"""Drop-in norm modules: torch.nn's own classes with a forward through this library's backward kernels, and
replace_norms, which turns a model's modules into them in place.

Each class subclasses its torch.nn counterpart and changes only forward, so the constructor, parameters,
buffers, state_dict, extra_repr and isinstance checks are torch's.
"""

import functools
import warnings

import torch
from torch.nn.modules.lazy import LazyModuleMixin
from torch.nn.utils import parametrize

import infiniop_py
from . import foreign_rms_norm, functional


class RMSNorm(torch.nn.RMSNorm):
    """torch.nn.RMSNorm with this library's backward."""

    def forward(self, x):
        if isinstance(x, functional._Proxy):
            return functional._traced_as_leaf(self, x)
        return functional.rms_norm(x, self.normalized_shape, self.weight, self.eps)


class LayerNorm(torch.nn.LayerNorm):
    """torch.nn.LayerNorm with this library's backward."""

    def forward(self, input):
        if isinstance(input, functional._Proxy):
            return functional._traced_as_leaf(self, input)
        return functional.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)


class _BatchNormForward:
    """torch.nn's BatchNorm forward (running statistics, num_batches_tracked and momentum=None's cumulative
    average as torch updates them) through functional.batch_norm."""

    def forward(self, input):
        if isinstance(input, functional._Proxy):
            return functional._traced_as_leaf(self, input)
        self._check_input_dim(input)
        tracking = self.training and self.track_running_stats
        average_factor = 0.0 if self.momentum is None else self.momentum
        if tracking and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # a cumulative moving average
                average_factor = 1.0 / float(self.num_batches_tracked)
        # Batch statistics in training, and in eval where there are no running ones.
        batch_statistics = self.training or (self.running_mean is None and self.running_var is None)
        use_running = not self.training or self.track_running_stats
        return functional.batch_norm(input, self.running_mean if use_running else None,
                                     self.running_var if use_running else None, self.weight, self.bias,
                                     batch_statistics, average_factor, self.eps)


class BatchNorm1d(_BatchNormForward, torch.nn.BatchNorm1d):
    """torch.nn.BatchNorm1d with this library's backward."""


class BatchNorm2d(_BatchNormForward, torch.nn.BatchNorm2d):
    """torch.nn.BatchNorm2d with this library's backward."""


class BatchNorm3d(_BatchNormForward, torch.nn.BatchNorm3d):
    """torch.nn.BatchNorm3d with this library's backward."""


REPLACEMENTS = {torch.nn.RMSNorm: RMSNorm, torch.nn.LayerNorm: LayerNorm, torch.nn.BatchNorm1d: BatchNorm1d,
                torch.nn.BatchNorm2d: BatchNorm2d, torch.nn.BatchNorm3d: BatchNorm3d}
_ORIGINALS = {ours: theirs for theirs, ours in REPLACEMENTS.items()}
_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_DEVICES = {"cpu": "cpu", "cuda": "nvidia"}


def replace_norms(module, rms_norms=()):
    """Turn every torch.nn.RMSNorm, LayerNorm and BatchNorm1d/2d/3d in ``module`` (itself included, recursively)
    into this package's class, in place: the same objects, parameters, buffers and hooks, so an optimizer built
    before still works. Subclasses of those classes are left alone (their forward may differ), but for the ones
    torch.nn.utils.parametrize makes (a parametrized weight or bias): their forward is the class's, and they become
    ours, parametrized as before. Lazy ones (LazyBatchNorm2d, ...) become ours when their parameters are made.
    Returns how many were replaced; modules this library cannot serve (parameters of a dtype or on a device it has
    no kernel for) stay as they are, named in one warning.

    ``rms_norms``: classes of RMSNorm modules written outside torch.nn, such as transformers' LlamaRMSNorm and
    GemmaRMSNorm (or the copies other models make of them), whose instances are replaced too (see
    foreign_rms_norm). Each is checked first: its own forward, run on a random probe, must be RMSNorm of the input
    with its weight (or 1 + weight) and epsilon; one that is not stays as it is, named in the warning."""
    foreign = _foreign_classes(rms_norms)
    replaced, kept = 0, []
    for name, submodule in module.named_modules():
        own = _own_class(submodule)
        replacement, reason = REPLACEMENTS.get(own), None
        if replacement is None:
            if own not in foreign:
                continue
            replacement, reason = foreign_rms_norm.replacement(submodule)
        if reason is None:
            reason = _unservable_reason(submodule)
        if reason is not None:
            kept.append(f"{name or type(submodule).__name__} ({reason})")
            continue
        _give_class(submodule, own, replacement)
        replaced += 1
    if kept:
        warnings.warn(f"replace_norms: kept these modules as they were: {', '.join(kept)}", stacklevel=2)
    return replaced


def restore_norms(module):
    """Undo replace_norms: turn every module it replaced in ``module`` (itself included) back into the class it was
    made as (torch.nn's, or the foreign RMSNorm class), in place, parametrized and lazy ones included. For a model
    to be pickled whole, exported or loaded where this package is not installed. Returns how many were restored."""
    restored = 0
    for submodule in module.modules():
        if not isinstance(submodule, LazyModuleMixin) and submodule.__dict__.get("cls_to_become") in _ORIGINALS:
            del submodule.cls_to_become  # left by a lazy module that became ours: it would pickle our class
        own = _own_class(submodule)
        original = _ORIGINALS.get(own) or getattr(own, "_infiniop_base", None)  # ours, or a foreign replacement
        if original is not None:
            _give_class(submodule, own, original)
            restored += 1
    return restored


def _give_class(module, own, cls):
    """Make ``module``, made as ``own`` (_own_class), one of ``cls``: its class, parametrize's class over ``cls``
    (its properties and methods, on ``cls`` as base), or for a lazy module the class it takes when its parameters
    are made (LazyModuleMixin reads it from the instance; the class's own where that is ``cls``)."""
    if own is type(module):
        module.__class__ = cls
    elif parametrize.is_parametrized(module):
        parametrized = type(module)
        module.__class__ = type(parametrized.__name__, (cls,), {
            key: value for key, value in vars(parametrized).items() if key not in ("__dict__", "__weakref__")})
    elif cls is type(module).cls_to_become:
        del module.cls_to_become
    else:
        module.cls_to_become = cls


def _own_class(module):
    """The class a module was made as: parametrize's subclass (torch.nn.utils.parametrize) stands for its base, a
    lazy module (LazyBatchNorm2d, ...) not yet materialized for the class it becomes."""
    cls = type(module)
    if parametrize.is_parametrized(module):
        return cls.__bases__[0]
    if isinstance(module, LazyModuleMixin) and module.has_uninitialized_params():
        return module.cls_to_become
    return cls


def _foreign_classes(rms_norms):
    """``rms_norms`` as a set of module classes, or a TypeError naming the argument."""
    try:
        classes = (rms_norms,) if isinstance(rms_norms, type) else tuple(rms_norms)
    except TypeError:
        raise TypeError(f"rms_norms: a torch.nn.Module class or an iterable of them, not {rms_norms!r}") from None
    for cls in classes:
        if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
            raise TypeError(f"rms_norms: {cls!r} is not a torch.nn.Module class")
    return set(classes)


def _unservable_reason(module):
    """Why this library cannot run the module's backward, or None where it can."""
    tensors = [*module.parameters(), *module.buffers()]  # a parametrized tensor's original is in a submodule
    floating = {tensor.dtype for tensor in tensors if tensor.is_floating_point()}
    unsupported = floating.difference(_DTYPES)
    if unsupported:
        return f"dtype {', '.join(sorted(str(dtype) for dtype in unsupported))}"
    if len(floating) > 1:
        return f"parameters of several dtypes: {', '.join(sorted(str(dtype) for dtype in floating))}"
    for device in {tensor.device for tensor in tensors}:
        reason = _device_reason(device.type, device.index or 0)
        if reason is not None:
            return reason
    return None


@functools.lru_cache(maxsize=None)
def _device_reason(device_type, index):
    """Why this library cannot run on a torch device, or None (meta: no data, nothing runs)."""
    if device_type == "meta":
        return None
    device = _DEVICES.get(device_type)
    if device is None:
        return f"no infiniop backend for torch device {device_type!r}"
    try:
        infiniop_py.Handle(device, index).close()
    except infiniop_py.InfiniopError as error:
        return f"{device_type}:{index}: {error}"
    return None
