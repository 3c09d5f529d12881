#include "calls.h"

#include "common/checked.h"

#include <utility>

namespace ascend {
namespace {

void addUnary(Plan &plan, const TensorSpec &from, const TensorSpec &to, Call::Prepare prepare, Call::Launch launch) {
    plan.add({{from}, {to}, std::move(prepare), launch});
}

// A new F32 workspace tensor of from's shape, packed.
TensorSpec scratchLike(Plan &plan, const TensorSpec &from) {
    infini::CheckedSize bytes = infini::CheckedSize(sizeof(float));
    for (int64_t extent : from.shape) bytes = bytes * static_cast<size_t>(extent);
    return TensorSpec::contiguous(from.shape, ACL_FLOAT, Buffer::scratch(plan.reserveScratch(bytes)));
}

// to = from + addend (aclnnAdds, alpha 1).
void addAdds(Plan &plan, const TensorSpec &from, double addend, const TensorSpec &to) {
    const Api &acl = plan.acl();
    const aclScalar *other = plan.floatScalar(static_cast<float>(addend)), *one = plan.floatScalar(1.0f);
    addUnary(plan, from, to,
             [&acl, other, one](aclTensor *const *t, uint64_t *ws, aclOpExecutor **ex) {
                 return acl.aclnnAddsGetWorkspaceSize(t[0], other, one, t[1], ws, ex);
             },
             acl.aclnnAdds);
}

} // namespace

void addCast(Plan &plan, const TensorSpec &from, const TensorSpec &to) {
    const Api &acl = plan.acl();
    const aclDataType target = to.dtype;
    addUnary(plan, from, to,
             [&acl, target](aclTensor *const *t, uint64_t *ws, aclOpExecutor **ex) {
                 return acl.aclnnCastGetWorkspaceSize(t[0], target, t[1], ws, ex);
             },
             acl.aclnnCast);
}

void addInverseSqrt(Plan &plan, const TensorSpec &from, double eps, const TensorSpec &to) {
    const Api &acl = plan.acl();
    TensorSpec shifted = from;
    if (eps > 0.0) {
        shifted = scratchLike(plan, from);
        addAdds(plan, from, eps, shifted);
    }
    addUnary(plan, shifted, to,
             [&acl](aclTensor *const *t, uint64_t *ws, aclOpExecutor **ex) {
                 return acl.aclnnRsqrtGetWorkspaceSize(t[0], t[1], ws, ex);
             },
             acl.aclnnRsqrt);
}

void addVarianceOfInverseSqrt(Plan &plan, const TensorSpec &from, double eps, const TensorSpec &to) {
    const TensorSpec deviation = scratchLike(plan, from);
    addDiv(plan, oneConstant(plan), from, deviation);
    if (eps == 0.0) {
        addDiv(plan, deviation, from, to);
        return;
    }
    const TensorSpec shifted = scratchLike(plan, from);
    addDiv(plan, deviation, from, shifted);
    addAdds(plan, shifted, -eps, to);
}

TensorSpec oneConstant(Plan &plan) {
    const float one = 1.0f;
    return TensorSpec::contiguous({1}, ACL_FLOAT, Buffer::constant(plan.addConstant(&one, sizeof one)));
}

void addDiv(Plan &plan, const TensorSpec &dividend, const TensorSpec &divisor, const TensorSpec &to) {
    const Api &acl = plan.acl();
    plan.add({{dividend, divisor},
              {to},
              [&acl](aclTensor *const *t, uint64_t *ws, aclOpExecutor **ex) {
                  return acl.aclnnDivGetWorkspaceSize(t[0], t[1], t[2], ws, ex);
              },
              acl.aclnnDiv});
}

} // namespace ascend
