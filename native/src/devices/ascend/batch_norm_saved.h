// What the aclnn BatchNorm operators hold in their saveInvstd tensor, by SoC (aclrtGetSocName):
// - aclnnBatchNorm writes there, by its document, the biased batch variance on Atlas training, inference, A2 and A3
//   products (Ascend910*, Ascend310P*) and 1/sqrt(var + eps) only on Ascend 950 (Ascend950*);
// - aclnnBatchNormBackward reads there the same: on Ascend 950 (CANN's "regbase" path) it hands saveInvstd to
//   BatchNormGradV3 as the inverse deviation, elsewhere to BNTrainingUpdateGrad / BNTrainingReduceGrad as their
//   batch_variance input, with eps (hicann/ops-nn, norm/batch_norm_grad_v3/op_host/op_api/
//   aclnn_batch_norm_backward.cpp, BatchNormBackwardProc); its document's formula takes sqrt(saveVar + eps) too,
//   though its parameter table words saveInvstd as the inverse deviation on every product.
// On any other SoC, or where the name cannot be had, it is unknown: descriptors that would pass or read it are
// NOT_IMPLEMENTED.
#ifndef INFINI_DEVICES_ASCEND_BATCH_NORM_SAVED_H
#define INFINI_DEVICES_ASCEND_BATCH_NORM_SAVED_H

#include "loader.h"

#include <string>

namespace ascend {

enum class SavedSpread { variance, invstd, unknown };

inline SavedSpread savedSpreadOf(const Api &acl) {
    const char *soc = acl.aclrtGetSocName != nullptr ? acl.aclrtGetSocName() : nullptr;
    if (soc == nullptr) return SavedSpread::unknown;
    const std::string name(soc);
    auto startsWith = [&](const char *prefix) { return name.rfind(prefix, 0) == 0; };
    if (startsWith("Ascend950")) return SavedSpread::invstd;
    if (startsWith("Ascend910") || startsWith("Ascend310P")) return SavedSpread::variance;
    return SavedSpread::unknown;
}

} // namespace ascend

#endif
