"""PyTorch training with this library's backward kernels.

Imported only on request (``import infiniop_py.torch``); the base package never imports torch.

- ``torch.ops.infiniop.{rms_norm,layer_norm,batch_norm}_backward``: the kernels as custom ops, with fake
  implementations, so torch.compile(fullgraph=True) traces them (see ``ops``).
- ``rms_norm``, ``layer_norm``, ``batch_norm``: torch.nn.functional's signatures; PyTorch's forward (on the CPU
  this library's where it takes the operands and is the faster: RMSNorm with a weight, BatchNorm, LayerNorm
  (F32 from a measured size on), docs/performance.md), our backward. In eager mode, CPU LayerNorm and BatchNorm inputs
  below a measured size run PyTorch's own norm end to end, backward included: it is
  the faster there (``functional._TORCH_BELOW``). Elsewhere BatchNorm's forward is PyTorch's native kernel, also on
  CUDA, where torch.nn.functional would take cuDNN's: the two round differently, so outputs can differ in the
  last bits from torch's with cuDNN.
- ``RMSNorm``, ``LayerNorm``, ``BatchNorm1d/2d/3d``: subclasses of torch.nn's modules (same constructor,
  parameters, buffers and state_dict) whose forward is the functional above.
- ``replace_norms(model)``: turns a model's torch norm modules into these, in place; with
  ``rms_norms=[...]``, also RMSNorm classes written outside torch.nn, such as transformers' LlamaRMSNorm and
  GemmaRMSNorm, each checked on a probe before it is swapped (see ``foreign_rms_norm``). ``restore_norms(model)``
  turns them back.
- For tensor subclasses (DTensor, FakeTensor, __torch_function__ overrides) and nested tensors, under torch.func's
  transforms (grad, vmap, jacrev, jvp; per-sample gradients through functional_call) and TorchDispatchModes
  (make_fx, FlopCounterMode), while torch.jit traces (torch.jit.trace, the TorchScript ONNX export) or torch.export
  exports and in forward-mode AD, the functionals and modules are torch.nn.functional's own functions (a replaced
  foreign RMSNorm its own class's forward): the kernels read plain memory, which wrapped and batched tensors do not
  have, a subclass's override and a mode must see the norm, a trace records torch's ops and not the kernels' writes,
  an exported program runs without this package, and our nodes have no forward derivative. torch.fx.symbolic_trace
  records the modules as leaves, as torch.nn's. torch.jit.script does not compile the drop-ins.
  Double backward (create_graph=True: gradient penalties, Hessian-vector products) takes PyTorch's own backward
  formulas, which it differentiates as stock's: the kernels serve the first-order backward.
- Under autocast they do what torch's do: where its autocast runs layer_norm or rms_norm in F32 (CUDA; rms_norm
  from torch 2.12), F16/BF16 operands are cast to F32 first and the output is F32 (see ``functional``).
- Every forward makes torch.nn.functional's argument checks first and raises torch's own error (``checks``):
  PyTorch's kernels that the forwards call do not check, and the backward kernels read the saved tensors.
- ``SyncBatchNorm``: torch.nn.SyncBatchNorm over torch.distributed, on the CPU (gloo) as on GPUs, with the
  two-phase backward (see ``sync_batch_norm``).
"""

from . import ops
from .functional import batch_norm, layer_norm, rms_norm
from .modules import BatchNorm1d, BatchNorm2d, BatchNorm3d, LayerNorm, RMSNorm, replace_norms, restore_norms
from .sync_batch_norm import SyncBatchNorm

__all__ = ["BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "LayerNorm", "RMSNorm", "batch_norm", "layer_norm", "ops",
           "replace_norms", "restore_norms", "rms_norm", "SyncBatchNorm"]
