"""RMSNorm modules as models outside torch.nn write them, for replace_norms(rms_norms=...): the two families of
transformers (Llama's, from the training bench, and Gemma's, written from what their forwards compute), and
modules that only look like them."""

from _torch_helpers import torch

from infiniop_py.bench.training import llama_rms_norm

HALF = (torch.float16, torch.bfloat16)


class LlamaStyleRMSNorm(llama_rms_norm(torch)):
    """Llama's (and Mistral's, Qwen's, ...), as the training bench has it, under an importable name (pickling a
    replaced module names its original class)."""


def _normalized(hidden_states, eps):
    """The input in F32 over its root mean square, as both families compute it."""
    wide = hidden_states.float()
    return wide * torch.rsqrt(wide.square().mean(-1, keepdim=True) + eps)


class GemmaStyleRMSNorm(torch.nn.Module):
    """Gemma's: the normalized input times 1 + weight in F32, rounded to the input's dtype; the weight starts at 0."""

    def __init__(self, size, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(size))
        self.eps = eps

    def forward(self, x):
        return (_normalized(x, self.eps) * (1.0 + self.weight.float())).type_as(x)


class T5StyleRMSNorm(LlamaStyleRMSNorm):
    """T5's: rounded to a 16-bit weight's dtype, not the input's (an output dtype rule of its own)."""

    def forward(self, hidden_states):
        normalized = _normalized(hidden_states, self.variance_epsilon)
        return self.weight * (normalized.to(self.weight.dtype) if self.weight.dtype in HALF else normalized)


class CenteredNorm(LlamaStyleRMSNorm):
    """LayerNorm without a bias (centered, then scaled), under an RMSNorm's attributes. Written out, not
    torch.nn.functional.layer_norm: that refuses the probe's mixed dtypes with a C++ exception, which the
    sanitizer stage's preloaded ASan runtime cannot intercept."""

    def forward(self, hidden_states):
        wide = hidden_states.float()
        centered = wide - wide.mean(-1, keepdim=True)
        return self.weight * _normalized(centered, self.variance_epsilon).to(hidden_states.dtype)


class WeightlessNorm(LlamaStyleRMSNorm):
    """RMSNorm that ignores its weight (at weight 1, as initialized, it looks like Llama's)."""

    def forward(self, hidden_states):
        return torch.nn.functional.rms_norm(hidden_states, self.weight.shape, None, self.variance_epsilon)


class BiasedRMSNorm(LlamaStyleRMSNorm):
    """Llama's forward, plus a bias the replacement would not use."""

    def __init__(self, size):
        super().__init__(size)
        self.bias = torch.nn.Parameter(torch.zeros(size))

    def forward(self, hidden_states):
        return super().forward(hidden_states) + self.bias


class MaskedRMSNorm(LlamaStyleRMSNorm):
    """A forward of two arguments."""

    def forward(self, hidden_states, mask):
        return super().forward(hidden_states) * mask


class FixedEpsilonRMSNorm(torch.nn.Module):
    """Llama's forward with its epsilon in no attribute."""

    def __init__(self, size):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(size))

    def forward(self, hidden_states):
        return self.weight * _normalized(hidden_states, 1e-6).to(hidden_states.dtype)


NOT_RMS_NORMS = {  # class: what the warning says of it
    T5StyleRMSNorm: "output dtypes", CenteredNorm: "is not RMSNorm", WeightlessNorm: "is not RMSNorm",
    BiasedRMSNorm: "state besides its weight: bias", MaskedRMSNorm: "forward failed on a probe: TypeError",
    FixedEpsilonRMSNorm: "no epsilon in variance_epsilon or eps",
}
