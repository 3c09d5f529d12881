#include "calls.h"

#include "common/checked.h"

#include <utility>

namespace ascend {
namespace {

void addUnary(Plan &plan, const TensorSpec &from, const TensorSpec &to, Call::Prepare prepare, Call::Launch launch) {
    plan.add({{from}, {to}, std::move(prepare), launch});
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
        infini::CheckedSize bytes = infini::CheckedSize(sizeof(float));
        for (int64_t extent : from.shape) bytes = bytes * static_cast<size_t>(extent);
        shifted = TensorSpec::contiguous(from.shape, ACL_FLOAT, Buffer::scratch(plan.reserveScratch(bytes)));
        const aclScalar *addend = plan.floatScalar(static_cast<float>(eps)), *one = plan.floatScalar(1.0f);
        addUnary(plan, from, shifted,
                 [&acl, addend, one](aclTensor *const *t, uint64_t *ws, aclOpExecutor **ex) {
                     return acl.aclnnAddsGetWorkspaceSize(t[0], addend, one, t[1], ws, ex);
                 },
                 acl.aclnnAdds);
    }
    addUnary(plan, shifted, to,
             [&acl](aclTensor *const *t, uint64_t *ws, aclOpExecutor **ex) {
                 return acl.aclnnRsqrtGetWorkspaceSize(t[0], t[1], ws, ex);
             },
             acl.aclnnRsqrt);
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
