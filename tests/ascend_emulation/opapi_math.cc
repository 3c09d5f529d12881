// Emulated libopapi_math: the elementwise aclnn operators the Ascend backend calls (aclnnCast, aclnnAdds,
// aclnnRsqrt, aclnnDiv), computed in double on host memory. Current CANN ships them in libopapi_math.so, apart
// from the norm operators (opapi_nn.cc); build.sh also links both into one legacy libopapi.so.
#include "opapi.h"

#include <cmath>

using namespace emu;

namespace {

// Position in `operand` of the element of `out` at flat index `flat`, numpy-style broadcasting.
int64_t broadcastFlat(const aclTensor *operand, const aclTensor *out, int64_t flat) {
    int64_t result = 0, scale = 1;
    size_t shift = out->shape.size() - operand->shape.size();
    for (size_t i = out->shape.size(); i-- > 0;) {
        int64_t index = flat % out->shape[i];
        flat /= out->shape[i];
        if (i < shift) continue;
        int64_t extent = operand->shape[i - shift];
        result += (extent == 1 ? 0 : index) * scale;
        scale *= extent;
    }
    return result;
}

bool broadcastsTo(const aclTensor *operand, const aclTensor *out) {
    if (operand->shape.size() > out->shape.size()) return false;
    size_t shift = out->shape.size() - operand->shape.size();
    for (size_t i = 0; i < operand->shape.size(); ++i) {
        if (operand->shape[i] != 1 && operand->shape[i] != out->shape[i + shift]) return false;
    }
    return true;
}

} // namespace

extern "C" {

aclnnStatus aclnnCastGetWorkspaceSize(const aclTensor *self, int dtype, aclTensor *out, uint64_t *ws,
                                      aclOpExecutor **ex) {
    if (!self || !out || !ws || !ex) return kParamNullptr;
    if (!isFloat(self->dtype) || !isFloat(dtype) || out->dtype != dtype || out->shape != self->shape) {
        return kParamInvalid;
    }
    int64_t n = numel(self);
    return plan({self}, {out}, [n](aclTensor *t) {
        for (int64_t i = 0; i < n; ++i) store(&t[1], i, load(&t[0], i));
    }, ws, ex);
}

EMULATED_SECOND_PHASE(aclnnCast)

// aclnnAdds: out = self + alpha * other (scalars); out has self's shape.
aclnnStatus aclnnAddsGetWorkspaceSize(const aclTensor *self, const aclScalar *other, const aclScalar *alpha,
                                      aclTensor *out, uint64_t *ws, aclOpExecutor **ex) {
    if (!self || !other || !alpha || !out || !ws || !ex) return kParamNullptr;
    if (!isFloat(self->dtype) || !isFloat(out->dtype) || out->shape != self->shape) return kParamInvalid;
    int64_t n = numel(self);
    double addend = alpha->value * other->value;
    return plan({self}, {out}, [n, addend](aclTensor *t) {
        for (int64_t i = 0; i < n; ++i) store(&t[1], i, load(&t[0], i) + addend);
    }, ws, ex);
}

EMULATED_SECOND_PHASE(aclnnAdds)

aclnnStatus aclnnRsqrtGetWorkspaceSize(const aclTensor *self, aclTensor *out, uint64_t *ws, aclOpExecutor **ex) {
    if (!self || !out || !ws || !ex) return kParamNullptr;
    if (!isFloat(self->dtype) || out->dtype != self->dtype || out->shape != self->shape) return kParamInvalid;
    int64_t n = numel(self);
    return plan({self}, {out}, [n](aclTensor *t) {
        for (int64_t i = 0; i < n; ++i) store(&t[1], i, 1.0 / std::sqrt(load(&t[0], i)));
    }, ws, ex);
}

EMULATED_SECOND_PHASE(aclnnRsqrt)

aclnnStatus aclnnDivGetWorkspaceSize(const aclTensor *self, const aclTensor *other, aclTensor *out, uint64_t *ws,
                                     aclOpExecutor **ex) {
    if (!self || !other || !out || !ws || !ex) return kParamNullptr;
    // out: any type the promoted one converts to (every float type converts to every other).
    if (!isFloat(self->dtype) || !isFloat(other->dtype) || !isFloat(out->dtype)) return kParamInvalid;
    if (!broadcastsTo(self, out) || !broadcastsTo(other, out)) return kParamInvalid;
    for (size_t i = 0; i < out->shape.size(); ++i) { // out is exactly the broadcast shape
        size_t k = out->shape.size() - i;
        int64_t a = k <= self->shape.size() ? self->shape[self->shape.size() - k] : 1;
        int64_t b = k <= other->shape.size() ? other->shape[other->shape.size() - k] : 1;
        if (out->shape[i] != (a == 1 ? b : a)) return kParamInvalid;
    }
    int64_t n = numel(out);
    return plan({self, other}, {out}, [n](aclTensor *t) {
        for (int64_t i = 0; i < n; ++i) {
            store(&t[2], i, load(&t[0], broadcastFlat(&t[0], &t[2], i)) / load(&t[1], broadcastFlat(&t[1], &t[2], i)));
        }
    }, ws, ex);
}

EMULATED_SECOND_PHASE(aclnnDiv)

} // extern "C"
