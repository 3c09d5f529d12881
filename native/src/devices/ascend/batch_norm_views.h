// aclTensor views of BatchNorm's tensors, forward and backward: the big ones as (N, C, L), the per-channel ones as
// F32 vectors.
#ifndef INFINI_DEVICES_ASCEND_BATCH_NORM_VIEWS_H
#define INFINI_DEVICES_ASCEND_BATCH_NORM_VIEWS_H

#include "calls.h"
#include "views.h"

#include "ops/batch_norm_layout.h"

#include <optional>

namespace ascend {

// The (N, C, L) view, format NCL, of the big tensor at `index` (L: the spatial dims flattened, whatever the rank)
// of a BatchNorm Info (forward or backward): channels-first packed, or channels-last ((N, L, C) in memory) as a
// strided view, which the aclnn BatchNorm operators take as non-contiguous (their NHWC / NDHWC formats are Ascend
// 950 only).
template <typename BatchNormInfo>
TensorSpec nclView(const BatchNormInfo &info, size_t index) {
    const int64_t n = static_cast<int64_t>(info.batch), c = static_cast<int64_t>(info.channels);
    const int64_t l = static_cast<int64_t>(info.length);
    const aclDataType dtype = aclDtypeOf(info.dtype);
    if (info.layout == op::BatchNormLayout::channels_first) {
        return TensorSpec::contiguous({n, c, l}, dtype, Buffer::argument(index), ACL_FORMAT_NCL);
    }
    return TensorSpec{{n, c, l}, {l * c, 1, c}, dtype, Buffer::argument(index), ACL_FORMAT_NCL};
}

// The per-channel (C,) vectors handed to aclnn as F32, the dtype every documented version of its BatchNorm operators
// accepts for them (older ones nothing else): an F16/BF16 argument goes through an F32 workspace copy, made with
// aclnnCast on the way in and cast back on the way out; an F32 one is passed as it is, strides and all.

class ChannelVectors {
  public:
    // `dtype`: the arguments' (parameters and running statistics); F32 ones are the saved statistics.
    ChannelVectors(Plan &plan, size_t channels, aclDataType dtype) : plan_(plan), channels_(channels), dtype_(dtype) {}

    Plan &plan() const { return plan_; }

    // The argument at `index` of the run's pointers, as the caller laid it out.
    TensorSpec argument(size_t index, ptrdiff_t stride, aclDataType dtype) const {
        return vectorView(channels_, stride, dtype, Buffer::argument(index));
    }
    // A new F32 vector in the workspace.
    TensorSpec scratch() {
        const size_t offset = plan_.reserveScratch(infini::CheckedSize(channels_) * sizeof(float));
        return TensorSpec::contiguous({static_cast<int64_t>(channels_)}, ACL_FLOAT, Buffer::scratch(offset));
    }
    // What aclnn reads for a parameter argument (nothing when not used): itself when F32, else an F32 copy.
    std::optional<TensorSpec> input(bool used, size_t index, ptrdiff_t stride) {
        if (!used) return std::nullopt;
        if (dtype_ == ACL_FLOAT) return argument(index, stride, ACL_FLOAT);
        TensorSpec copy = scratch();
        addCast(plan_, argument(index, stride, dtype_), copy);
        return copy;
    }
    // Where aclnn writes a parameter-dtype output (nothing when not wanted): itself when F32, else an F32 vector
    // that finish() casts into it.
    std::optional<TensorSpec> output(bool wanted, size_t index, ptrdiff_t stride) {
        if (!wanted) return std::nullopt;
        return dtype_ == ACL_FLOAT ? argument(index, stride, ACL_FLOAT) : scratch();
    }
    // After aclnn wrote `written` (input()'s or output()'s F32 vector of the argument at `index`): the cast back.
    void finish(const std::optional<TensorSpec> &written, size_t index, ptrdiff_t stride) {
        if (written && dtype_ != ACL_FLOAT) addCast(plan_, *written, argument(index, stride, dtype_));
    }

  private:
    Plan &plan_;
    size_t channels_;
    aclDataType dtype_;
};

} // namespace ascend

#endif
