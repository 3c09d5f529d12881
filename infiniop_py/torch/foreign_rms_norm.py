"""RMSNorm modules written outside torch.nn, with this library's backward: transformers' LlamaRMSNorm and
GemmaRMSNorm, and the copies other models make of them. ``replace_norms(model, rms_norms=[...])`` gives such a
module a subclass of its own class whose forward is functional.rms_norm with the module's weight and epsilon.

A class is known here only by what its forward computes, so each module is checked before it is replaced: its
own forward runs (without its hooks) on a random probe, with a random weight in place of its own, on the CPU:
- in F32, its output must be torch.nn.functional.rms_norm of the probe with the weight (Llama: weight *
  normalized) or with 1 + weight (Gemma: normalized * (1 + weight), a weight that starts at zero);
- the dtype of its output for BF16 data with F32 weights and for F32 data with BF16 weights must be the promoted
  type of the two (Llama: weight * normalized.to(input dtype)) or the data's (Gemma: ``.type_as(x)``).
The replacement gives the same dtype. Its values differ from the original's only in rounding: Llama rounds the
normalized input to the data's dtype before it multiplies by the weight; ours rounds once, as torch.nn.RMSNorm.
"""

import functools
import numbers

import torch

from . import functional

_EPSILON_NAMES = ("variance_epsilon", "eps")  # transformers' names for it, Llama's first


class ForeignRMSNorm:
    """Mixed into the replacement of a foreign RMSNorm class, before that class: the forward, and pickling."""

    _infiniop_base = None           # the class replaced
    _infiniop_epsilon = "variance_epsilon"  # the attribute that holds epsilon, read on every call
    _infiniop_offset = 0.0          # 1.0: the forward multiplies by 1 + weight
    _infiniop_data_dtype = False    # the output in the data's dtype, else in the promoted type of data and weight

    def forward(self, hidden_states):
        if isinstance(hidden_states, functional._Proxy):
            return functional._traced_as_leaf(self, hidden_states)
        weight = self.weight  # read once: a parameter is found through nn.Module.__getattr__
        eps = getattr(self, self._infiniop_epsilon)
        # Where the functionals are torch's (an epsilon the kernels do not take too): its class's.
        if functional._torch_serves(hidden_states, weight) or not 0.0 <= eps < functional._INF:
            return self._infiniop_base.forward(self, hidden_states)
        # As Gemma's forward has it (1 + weight); autograd takes the gradient to the weight.
        scale = 1.0 + weight.float() if self._infiniop_offset else weight
        # As called: autocast's policy for torch's rms_norm has no part in the module's own forward.
        output = functional._rms_norm_as_called(hidden_states, scale.shape, scale, eps)
        dtype = (hidden_states.dtype if self._infiniop_data_dtype
                 else torch.promote_types(hidden_states.dtype, weight.dtype))
        return output if output.dtype is dtype else output.to(dtype)

    def __reduce_ex__(self, protocol):
        # The class is made at run time, under no importable name: pickled as the call that makes it again.
        _, _, *state = super().__reduce_ex__(max(protocol, 2))
        return (_new_instance, _key(type(self)), *state)


def _key(cls):
    return cls._infiniop_base, cls._infiniop_epsilon, cls._infiniop_offset, cls._infiniop_data_dtype


def _new_instance(base, epsilon, offset, data_dtype):
    cls = _replacement_class(base, epsilon, offset, data_dtype)
    return cls.__new__(cls)


@functools.lru_cache(maxsize=None)
def _replacement_class(base, epsilon, offset, data_dtype):
    """The subclass of ``base`` that replaces it: named as it is (repr, isinstance and state_dict unchanged)."""
    return type(base.__name__, (ForeignRMSNorm, base), {
        "__module__": __name__, "__qualname__": base.__qualname__,
        "__doc__": f"{base.__qualname__} with this library's backward (infiniop_py.torch.replace_norms).",
        "_infiniop_base": base, "_infiniop_epsilon": epsilon, "_infiniop_offset": offset,
        "_infiniop_data_dtype": data_dtype})


def replacement(module):
    """(the class to give ``module``, None), or (None, why it cannot be replaced)."""
    weight = module._parameters.get("weight")
    if not isinstance(weight, torch.Tensor) or weight.dim() != 1:
        return None, "no one-dimensional weight"
    others = [name for name, _ in module.named_parameters() if name != "weight"]
    others += [name for name, _ in module.named_buffers()]
    if others:  # state the replacement's forward would not use
        return None, f"state besides its weight: {', '.join(others)}"
    epsilon = next((name for name in _EPSILON_NAMES if _is_number(getattr(module, name, None))), None)
    if epsilon is None:
        return None, f"no epsilon in {' or '.join(_EPSILON_NAMES)}"
    behaviour = _probe(module, weight.shape[0], float(getattr(module, epsilon)))
    if isinstance(behaviour, str):
        return None, behaviour
    return _replacement_class(type(module), epsilon, *behaviour), None


def _is_number(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _probe(module, size, eps):
    """(offset, data_dtype) of the module's forward (see the module's docstring), or why it is not RMSNorm."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(4, size, generator=generator) * 2 + 0.5
    weight = torch.randn(size, generator=generator) * 0.5 + 1.0
    try:
        output = _own_forward(module, x, weight)
        half_data = _own_forward(module, x.bfloat16(), weight)
        half_weight = _own_forward(module, x, weight.bfloat16())
    except Exception as error:  # noqa: BLE001 - any failure of a foreign forward means: not replaceable
        return f"its forward failed on a probe: {type(error).__name__}: {error}"
    offsets = [offset for offset in (0.0, 1.0) if _is_rms_norm(output, x, weight + offset, eps)]
    if not offsets:
        return "its forward is not RMSNorm of the input with its weight and epsilon"
    dtypes = tuple(getattr(result, "dtype", None) for result in (half_data, half_weight))
    rules = {(torch.float32, torch.float32): False, (torch.bfloat16, torch.float32): True}
    if dtypes not in rules:
        return f"its output dtypes {dtypes} are neither the data's nor the promoted type of data and weight"
    return offsets[0], rules[dtypes]


def _own_forward(module, x, weight):
    """The class's own forward (not module(x): no hooks run) with ``weight`` in place of the module's."""
    own = module._parameters["weight"]
    module._parameters["weight"] = torch.nn.Parameter(weight, requires_grad=False)
    try:
        with torch.no_grad():
            return type(module).forward(module, x)
    finally:
        module._parameters["weight"] = own


def _is_rms_norm(output, x, weight, eps):
    if not isinstance(output, torch.Tensor) or output.shape != x.shape or output.dtype != torch.float32:
        return False
    return torch.allclose(output, torch.nn.functional.rms_norm(x, [x.shape[-1]], weight, eps), rtol=1e-5, atol=1e-6)
