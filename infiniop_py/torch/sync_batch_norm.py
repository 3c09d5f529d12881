"""SyncBatchNorm over torch.distributed (gloo on CPU, NCCL on GPU): BatchNorm with the statistics of the whole
batch, split over the processes of a group, and this library's two-phase backward.

Forward: each rank's per-channel mean and biased variance (PyTorch's batch_norm_update_stats, in F32), turned
into sums of values and of squares in F64 with its element count, one all_reduce, then PyTorch's BatchNorm kernel
normalizes with the global mean and biased variance; the running statistics take the global unbiased variance,
as torch's SyncBatchNorm does. Backward: the reduce phase (per-channel sums of grad_output and
grad_output * (x - mean) of this rank's data, and its weight and bias gradients), one all_reduce of the two sums,
and the elementwise phase with the global element count. Weight and bias gradients stay per rank, as in torch's
SyncBatchNorm (DistributedDataParallel averages them). Uneven batches, a rank with an empty one included,
work: counts are summed, never assumed equal.
"""

import torch
import torch.distributed as dist

import infiniop_py
from . import checks, functional
from .ops import _batch_packed, _f32_parameters, _same_layout, _statistics_dtype


class _SyncBatchNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, weight, bias, running_mean, running_var, eps, momentum, process_group):
        channels = input.shape[1]
        local_count = input.numel() // channels
        statistics = input.new_zeros(2 * channels + 1, dtype=torch.float64)  # sums of x, of x^2; the count
        if local_count:
            values = input.detach() if input.dtype in (torch.float32, torch.float64) else input.detach().float()
            # PyTorch's BatchNorm statistics kernel: 4x faster than var_mean over (0, 2, 3) on one CPU thread.
            local_mean, local_variance = torch.batch_norm_update_stats(values, None, None, 0.0)
            local_mean = local_mean.double()
            statistics[:channels] = local_mean * local_count
            statistics[channels:2 * channels] = (local_variance.double() + local_mean.square()) * local_count
        statistics[-1] = local_count
        dist.all_reduce(statistics, group=process_group)
        count = int(statistics[-1].item())
        if count <= 1:
            raise ValueError(f"Expected more than 1 value per channel when training, got {count} over all ranks "
                             f"(input size {tuple(input.shape)} on this one)")
        mean = statistics[:channels] / count
        variance = (statistics[channels:2 * channels] / count - mean.square()).clamp_min_(0.0)
        statistics_dtype = _statistics_dtype(input.dtype)
        # PyTorch's kernel normalizes with the global statistics (its eval mode takes them as given), in F32 for
        # 16-bit data (its mixed-precision path: F32 statistics need F32 parameters).
        f32_weight, f32_bias = _f32_parameters(input, weight, bias)
        output = torch.native_batch_norm(input, f32_weight, f32_bias, mean.to(statistics_dtype),
                                         variance.to(statistics_dtype), False, 0.0, eps)[0]
        if running_mean is not None and running_var is not None:
            with torch.no_grad():
                running_mean.mul_(1.0 - momentum).add_(mean.to(running_mean.dtype), alpha=momentum)
                unbiased = variance * (count / (count - 1))
                running_var.mul_(1.0 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)
        invstd = torch.rsqrt(variance + eps).to(statistics_dtype)
        ctx.save_for_backward(input, weight, mean.to(statistics_dtype), invstd)
        ctx.count, ctx.process_group = count, process_group
        return output

    @staticmethod
    def backward(ctx, grad_output):
        input, weight, mean, invstd = ctx.saved_tensors
        if torch.is_grad_enabled():  # the engine records this backward: create_graph=True
            # The kernels' gradients cannot be differentiated again, and autograd would take them for constants: a
            # gradient penalty through them would silently lack this layer's second-order terms. Refused on every
            # rank alike, before any collective.
            raise RuntimeError("SyncBatchNorm: no double backward (create_graph=True); its backward's kernels and "
                               "all_reduce have no derivative")
        grad_output = _same_layout(grad_output, input)
        need_input, need_weight, need_bias = ctx.needs_input_grad[:3]
        parameter_dtype = weight.dtype if weight is not None else input.dtype
        channels = input.shape[1]
        sums = input.new_empty(2 * channels, dtype=mean.dtype)  # one all_reduce for both
        grad_weight = input.new_empty(channels, dtype=parameter_dtype) if need_weight else None
        grad_bias = input.new_empty(channels, dtype=parameter_dtype) if need_bias else None
        infiniop_py.batch_norm_backward_reduce(input, grad_output, save_mean=mean, save_invstd=invstd,
                                               need_grad_weight=need_weight, need_grad_bias=need_bias,
                                               out=(sums[:channels], sums[channels:], grad_weight, grad_bias))
        grad_input = None
        if need_input:
            dist.all_reduce(sums, group=ctx.process_group)
            grad_input = infiniop_py.batch_norm_backward_elementwise(
                input, grad_output, weight, None, None, sums[:channels], sums[channels:], ctx.count,
                save_mean=mean, save_invstd=invstd)
        return grad_input, grad_weight, grad_bias, None, None, None, None, None


class SyncBatchNorm(torch.nn.modules.batchnorm._BatchNorm):
    """torch.nn.SyncBatchNorm's constructor, parameters, buffers and state_dict, on the CPU (gloo) as on GPUs, with
    this library's backward. Outside an initialized process group, with world size 1, or in eval mode it is this
    package's BatchNorm. It shares torch.nn.SyncBatchNorm's base class, not the class itself:
    DistributedDataParallel refuses CPU modules holding a torch.nn.SyncBatchNorm."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True,
                 process_group=None, device=None, dtype=None, *, bias=True):
        # torch before 2.12 has no `bias` argument (nor then has this class): pass it only where it is not the
        # default.
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device=device, dtype=dtype,
                         **({} if bias else {"bias": False}))
        self.process_group = process_group

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def _check_non_zero_input_channels(self, input):
        if input.size(1) == 0:
            raise ValueError("SyncBatchNorm number of input channels should be non-zero")

    def forward(self, input):
        if isinstance(input, functional._Proxy):
            return functional._traced_as_leaf(self, input)
        self._check_input_dim(input)
        self._check_non_zero_input_channels(input)
        tracking = self.training and self.track_running_stats
        average_factor = 0.0 if self.momentum is None else self.momentum
        if tracking:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # a cumulative moving average
                average_factor = 1.0 / float(self.num_batches_tracked)
        batch_statistics = self.training or (self.running_mean is None and self.running_var is None)
        running_mean = self.running_mean if not self.training or self.track_running_stats else None
        running_var = self.running_var if not self.training or self.track_running_stats else None
        group = self._group()
        if not (batch_statistics and self.training and group is not None):
            return functional.batch_norm(input, running_mean, running_var, self.weight, self.bias, batch_statistics,
                                         average_factor, self.eps)
        checks.batch_norm(input, self.weight, self.bias, running_mean, running_var, True, average_factor, self.eps)
        if not _batch_packed(input):
            input = input.contiguous()
        return _SyncBatchNormFunction.apply(input, self.weight, self.bias, running_mean, running_var, self.eps,
                                            average_factor, group)

    def _group(self):
        """The process group to synchronize over, or None where there is nothing to synchronize."""
        if not (dist.is_available() and dist.is_initialized()):
            return None
        group = self.process_group or dist.group.WORLD
        return group if dist.get_world_size(group) > 1 else None

    @classmethod
    def convert_sync_batchnorm(cls, module, process_group=None):
        """``module`` with every BatchNorm*D (torch's or this package's) replaced by a SyncBatchNorm of this package
        holding the same parameters and buffers, as torch.nn.SyncBatchNorm.convert_sync_batchnorm does."""
        converted = module
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and type(module) is not cls:
            converted = cls(module.num_features, module.eps, module.momentum, module.affine,
                            module.track_running_stats, process_group, bias=module.bias is not None)
            if module.affine:
                with torch.no_grad():
                    converted.weight = module.weight
                    converted.bias = module.bias
            converted.running_mean = module.running_mean
            converted.running_var = module.running_var
            converted.num_batches_tracked = module.num_batches_tracked
            converted.training = module.training
            if hasattr(module, "qconfig"):
                converted.qconfig = module.qconfig
        for name, child in module.named_children():
            converted.add_module(name, cls.convert_sync_batchnorm(child, process_group))
        return converted
