// Emulated libopapi_nn: the norm aclnn operators the Ascend backend calls (aclnnRmsNorm, aclnnRmsNormGrad,
// aclnnLayerNorm, aclnnLayerNormBackward, aclnnBatchNorm, aclnnBatchNormBackward), computed in double on host
// memory. The first phase checks what each operator's CANN document lists (dtypes and their combinations, formats,
// contiguity, empty tensors) and answers 161001 / 161002 as documented, except the shapes of the operators whose
// real kernels check them in their tiling, which answers 561002 (ACLNN_ERR_INNER_TILING_ERROR); aclnnLayerNorm and
// aclnnBatchNorm check shapes in their first phase (161002, as their documents list). The second phase is opapi.h's
// launch.
#include "opapi.h"

#include <cmath>
#include <cstring>
#include <initializer_list>

using namespace emu;

namespace {

bool rankOk(const aclTensor *t) { return t->shape.size() >= 1 && t->shape.size() <= 8; }

int64_t product(const std::vector<int64_t> &dims, size_t begin, size_t end) {
    int64_t n = 1;
    for (size_t i = begin; i < end; ++i) n *= dims[i];
    return n;
}

std::vector<int64_t> head(const std::vector<int64_t> &dims, size_t n) { return {dims.begin(), dims.begin() + n}; }
std::vector<int64_t> tail(const std::vector<int64_t> &dims, size_t n) { return {dims.end() - n, dims.end()}; }

// aclnnRmsNorm / aclnnRmsNormGrad, Atlas A2 table: (x, gamma) in F16/F32, BF16/F32, F16/F16, F32/F32, BF16/BF16.
bool rmsDtypes(int x, int gamma) {
    return (gamma == kFloat && (x == kFloat16 || x == kBf16 || x == kFloat)) ||
           (gamma == x && (x == kFloat16 || x == kBf16));
}

// Per row of a (rows, cols) view: mean and biased variance, two passes in double.
void rowMoments(const aclTensor *t, int64_t row, int64_t cols, double *mean, double *var) {
    double sum = 0, squares = 0;
    for (int64_t c = 0; c < cols; ++c) sum += load(t, row * cols + c);
    *mean = sum / cols;
    for (int64_t c = 0; c < cols; ++c) squares += std::pow(load(t, row * cols + c) - *mean, 2);
    *var = squares / cols;
}

// aclnnLayerNorm's dtype rules: weight / bias the input's dtype or FLOAT, one dtype when both are given; meanOut /
// rstdOut the input's dtype (the newest document's words) or FLOAT, which CANN's first phase accepts and torch_npu
// passes for 16-bit input.
bool layerNormDtypes(const aclTensor *input, const aclTensor *weight, const aclTensor *bias, const aclTensor *out,
                     const aclTensor *mean, const aclTensor *rstd) {
    int dt = input->dtype;
    if (!isFloat(dt) || out->dtype != dt || (weight && bias && weight->dtype != bias->dtype)) return false;
    for (const aclTensor *t : {weight, bias, mean, rstd}) {
        if (t && t->dtype != dt && t->dtype != kFloat) return false;
    }
    return true;
}

// aclnnLayerNorm's shape rules (its first phase checks them: 161002): normalizedShape the input's trailing dims,
// weight / bias of that shape, out of the input's, meanOut / rstdOut [A1..Ai, 1..1] of the input's rank.
bool layerNormShapes(const aclTensor *input, const std::vector<int64_t> &norm, const aclTensor *weight,
                     const aclTensor *bias, const aclTensor *out, const aclTensor *mean, const aclTensor *rstd) {
    size_t rank = input->shape.size();
    if (norm.empty() || norm.size() > rank || tail(input->shape, norm.size()) != norm || out->shape != input->shape) {
        return false;
    }
    std::vector<int64_t> statistic = head(input->shape, rank - norm.size());
    statistic.resize(rank, 1);
    return (!weight || weight->shape == norm) && (!bias || bias->shape == norm) && (!mean || mean->shape == statistic) &&
           (!rstd || rstd->shape == statistic);
}

int bnFormatFor(size_t rank) {
    switch (rank) {
    case 2: return kNc;
    case 3: return kNcl;
    case 4: return kNchw;
    case 5: return kNcdhw;
    default: return kNd;
    }
}

// What aclnnBatchNorm leaves in saveInvstd, and aclnnBatchNormBackward reads there, by product (aclnnBatchNorm's
// document, aclnnBatchNormBackward's source): 1/sqrt(var + eps) on Ascend 950, the biased batch variance on the
// others they support (Atlas training, inference, A2 and A3 products).
bool savesInvstd() {
    const char *soc = aclrtGetSocName();
    return soc != nullptr && std::strncmp(soc, "Ascend950", 9) == 0;
}

// aclnnBatchNorm's first-phase checks (161002 for each, shapes included): float dtypes, input and output of one
// format (the rank's: NC, NCL, NCHW, NCDHW, ND) and shape of rank 2..8, the per-channel tensors given of shape (C,).
bool batchNormArgumentsOk(const aclTensor *input, const aclTensor *output,
                          std::initializer_list<const aclTensor *> vectors) {
    size_t rank = input->shape.size();
    if (!isFloat(input->dtype) || !isFloat(output->dtype) || rank < 2 || rank > 8) return false;
    if (input->format != bnFormatFor(rank) || output->format != input->format || output->shape != input->shape) {
        return false;
    }
    for (const aclTensor *t : vectors) {
        if (t && (!isFloat(t->dtype) || t->shape != std::vector<int64_t>{input->shape[1]})) return false;
    }
    return true;
}

// Per channel c of an (N, C, L) view: mean and biased variance over N and L, two passes in double.
void channelMoments(const aclTensor *t, int64_t batch, int64_t channels, int64_t length, int64_t c, double *mean,
                    double *var) {
    double sum = 0, squares = 0, count = static_cast<double>(batch * length);
    for (int64_t n = 0; n < batch; ++n) {
        for (int64_t l = 0; l < length; ++l) sum += load(t, (n * channels + c) * length + l);
    }
    *mean = sum / count;
    for (int64_t n = 0; n < batch; ++n) {
        for (int64_t l = 0; l < length; ++l) squares += std::pow(load(t, (n * channels + c) * length + l) - *mean, 2);
    }
    *var = squares / count;
}

} // namespace

extern "C" {

// aclnnRmsNorm: y = x * rstd * gamma, rstd = 1/sqrt(mean(x^2) + eps) over gamma's trailing dims.
aclnnStatus aclnnRmsNormGetWorkspaceSize(const aclTensor *x, const aclTensor *gamma, double epsilon,
                                         const aclTensor *y, const aclTensor *rstd, uint64_t *ws,
                                         aclOpExecutor **ex) {
    if (!x || !gamma || !y || !rstd || !ws || !ex) return kParamNullptr;
    if (!rmsDtypes(x->dtype, gamma->dtype) || y->dtype != x->dtype || rstd->dtype != kFloat) return kParamInvalid;
    for (const aclTensor *t : {x, gamma, y, rstd}) {
        if (!rankOk(t) || t->format != kNd) return kParamInvalid;
    }
    size_t k = gamma->shape.size();
    if (numel(x) == 0) return kParamInvalid;
    if (k > x->shape.size() || gamma->shape != tail(x->shape, k) || y->shape != x->shape) return kTilingError;
    std::vector<int64_t> rstd_shape = head(x->shape, x->shape.size() - k);
    rstd_shape.resize(x->shape.size(), 1); // x (4,1,4096), gamma (4096) -> rstd (4,1,1)
    if (rstd->shape != rstd_shape) return kTilingError;
    int64_t rows = numel(rstd), cols = numel(gamma);
    if (!tilable(cols)) return kTilingError;
    return plan({x, gamma}, {y, rstd}, [rows, cols, epsilon](aclTensor *t) {
        for (int64_t r = 0; r < rows; ++r) {
            double squares = 0;
            for (int64_t c = 0; c < cols; ++c) squares += std::pow(load(&t[0], r * cols + c), 2);
            double inv = 1.0 / std::sqrt(squares / cols + epsilon);
            store(&t[3], r, inv);
            for (int64_t c = 0; c < cols; ++c) store(&t[2], r * cols + c, load(&t[0], r * cols + c) * inv * load(&t[1], c));
        }
    }, ws, ex);
}

EMULATED_SECOND_PHASE(aclnnRmsNorm)

// aclnnRmsNormGrad: the Atlas A2 dtype table, rstd = x_shape[0:n], dgamma F32, no non-contiguous, no empty.
aclnnStatus aclnnRmsNormGradGetWorkspaceSize(const aclTensor *dy, const aclTensor *x, const aclTensor *rstd,
                                             const aclTensor *gamma, const aclTensor *dx, const aclTensor *dgamma,
                                             uint64_t *ws, aclOpExecutor **ex) {
    if (!dy || !x || !rstd || !gamma || !dx || !dgamma || !ws || !ex) return kParamNullptr;
    int d = dy->dtype;
    if (!rmsDtypes(d, gamma->dtype) || x->dtype != d || dx->dtype != d || rstd->dtype != kFloat ||
        dgamma->dtype != kFloat) {
        return kParamInvalid;
    }
    for (const aclTensor *t : {dy, x, rstd, gamma, dx, dgamma}) {
        if (!rankOk(t) || t->format != kNd || !isContiguous(t) || numel(t) == 0) return kParamInvalid;
    }
    size_t k = gamma->shape.size();
    if (k >= x->shape.size() + 1 || dy->shape != x->shape || dx->shape != x->shape || gamma->shape != tail(x->shape, k) ||
        rstd->shape != head(x->shape, x->shape.size() - k) || dgamma->shape != gamma->shape) {
        return kTilingError;
    }
    int64_t cols = numel(gamma), rows = numel(x) / cols;
    if (!tilable(cols)) return kTilingError;
    return plan({dy, x, rstd, gamma}, {dx, dgamma}, [rows, cols](aclTensor *t) {
        std::vector<double> dg(cols, 0.0);
        for (int64_t r = 0; r < rows; ++r) {
            double inv = load(&t[2], r), mean = 0;
            for (int64_t c = 0; c < cols; ++c) {
                mean += load(&t[0], r * cols + c) * load(&t[3], c) * load(&t[1], r * cols + c) * inv;
            }
            mean /= cols;
            for (int64_t c = 0; c < cols; ++c) {
                double dyv = load(&t[0], r * cols + c), xv = load(&t[1], r * cols + c);
                store(&t[4], r * cols + c, (dyv * load(&t[3], c) - xv * inv * mean) * inv);
                dg[c] += xv * inv * dyv;
            }
        }
        for (int64_t c = 0; c < cols; ++c) store(&t[5], c, dg[c]);
    }, ws, ex);
}

EMULATED_SECOND_PHASE(aclnnRmsNormGrad)

// aclnnLayerNormBackward: the checks its document lists as 161001 / 161002 (shapes: 561002); strided tensors allowed.
aclnnStatus aclnnLayerNormBackwardGetWorkspaceSize(const aclTensor *grad_out, const aclTensor *input,
                                                   const aclIntArray *normalized_shape, const aclTensor *mean,
                                                   const aclTensor *rstd, const aclTensor *weight,
                                                   const aclTensor *bias, const aclBoolArray *mask,
                                                   aclTensor *grad_input, aclTensor *grad_weight,
                                                   aclTensor *grad_bias, uint64_t *ws, aclOpExecutor **ex) {
    if (!grad_out || !input || !normalized_shape || !mean || !rstd || !mask || !ws || !ex) return kParamNullptr;
    if (mask->values.size() != 3) return kParamInvalid;
    if ((mask->values[0] && !grad_input) || (mask->values[1] && !grad_weight) || (mask->values[2] && !grad_bias)) {
        return kParamNullptr;
    }
    int dt = input->dtype;
    if (!isFloat(dt) || grad_out->dtype != dt || !isFloat(mean->dtype) || rstd->dtype != mean->dtype ||
        dtypeBits(mean->dtype) < dtypeBits(dt)) {
        return kParamInvalid;
    }
    if ((weight && (weight->dtype != dt && weight->dtype != kFloat)) ||
        (bias && (bias->dtype != dt && bias->dtype != kFloat)) || (weight && bias && weight->dtype != bias->dtype)) {
        return kParamInvalid;
    }
    const std::vector<int64_t> &norm = normalized_shape->values;
    if (norm.empty()) return kParamInvalid;
    if (input->shape.size() < norm.size() || grad_out->shape != input->shape ||
        tail(input->shape, norm.size()) != norm) {
        return kTilingError;
    }
    size_t lead = input->shape.size() - norm.size();
    int64_t rows = product(input->shape, 0, lead), cols = product(norm, 0, norm.size());
    if (numel(mean) != rows || numel(rstd) != rows || mean->shape != rstd->shape) return kTilingError;
    if ((weight && weight->shape != norm) || (bias && bias->shape != norm)) return kTilingError;
    int param_dtype = weight ? weight->dtype : dt;
    if (mask->values[0] && grad_input->dtype != dt) return kParamInvalid;
    if (mask->values[0] && grad_input->shape != input->shape) return kTilingError;
    for (int i : {1, 2}) {
        const aclTensor *out = i == 1 ? grad_weight : grad_bias;
        if (mask->values[i] && out->dtype != param_dtype) return kParamInvalid;
        if (mask->values[i] && out->shape != norm) return kTilingError;
    }
    if (!tilable(cols)) return kTilingError;
    for (const aclTensor *t : {grad_out, input, mean, rstd, weight, bias, (const aclTensor *)grad_input,
                               (const aclTensor *)grad_weight, (const aclTensor *)grad_bias}) {
        if (t && t->format != kNd) return kParamInvalid;
    }
    // weightOptional NULL: ones of input's dtype (the document's construction); bias does not enter the gradients.
    // Outputs not asked for are not written.
    bool has_weight = weight != nullptr;
    std::vector<bool> want = mask->values;
    return plan({grad_out, input, mean, rstd, weight, bias}, {grad_input, grad_weight, grad_bias},
                [rows, cols, has_weight, want](aclTensor *t) {
        aclTensor *gi = &t[6], *gw = &t[7], *gb = &t[8];
        std::vector<double> sum_w(cols, 0.0), sum_b(cols, 0.0), g(cols), xhat(cols);
        for (int64_t r = 0; r < rows; ++r) {
            double mu = load(&t[2], r), inv = load(&t[3], r), mean_g = 0, mean_gx = 0;
            for (int64_t c = 0; c < cols; ++c) {
                double go = load(&t[0], r * cols + c);
                xhat[c] = (load(&t[1], r * cols + c) - mu) * inv;
                g[c] = go * (has_weight ? load(&t[4], c) : 1.0);
                mean_g += g[c];
                mean_gx += g[c] * xhat[c];
                sum_w[c] += go * xhat[c];
                sum_b[c] += go;
            }
            mean_g /= cols;
            mean_gx /= cols;
            if (want[0]) {
                for (int64_t c = 0; c < cols; ++c) store(gi, r * cols + c, inv * (g[c] - mean_g - xhat[c] * mean_gx));
            }
        }
        for (int64_t c = 0; c < cols; ++c) {
            if (want[1]) store(gw, c, sum_w[c]);
            if (want[2]) store(gb, c, sum_b[c]);
        }
    }, ws, ex);
}

EMULATED_SECOND_PHASE(aclnnLayerNormBackward)

// aclnnLayerNorm: out = (x - E[x]) / sqrt(Var[x] + eps) * w + b over normalizedShape's trailing dims, the biased
// variance; the optional meanOut = E[x] and rstdOut = 1/sqrt(Var[x] + eps). weight absent: ones, bias absent: zeros.
// Strided tensors allowed.
aclnnStatus aclnnLayerNormGetWorkspaceSize(const aclTensor *input, const aclIntArray *normalized_shape,
                                           const aclTensor *weight, const aclTensor *bias, double eps, aclTensor *out,
                                           aclTensor *mean, aclTensor *rstd, uint64_t *ws, aclOpExecutor **ex) {
    if (!input || !normalized_shape || !out || !ws || !ex) return kParamNullptr;
    if (!layerNormDtypes(input, weight, bias, out, mean, rstd)) return kParamInvalid;
    for (const aclTensor *t : {input, weight, bias, (const aclTensor *)out, (const aclTensor *)mean,
                               (const aclTensor *)rstd}) {
        if (t && (!rankOk(t) || t->format != kNd)) return kParamInvalid;
    }
    const std::vector<int64_t> &norm = normalized_shape->values;
    if (!layerNormShapes(input, norm, weight, bias, out, mean, rstd)) return kParamInvalid;
    int64_t cols = product(norm, 0, norm.size()), rows = cols == 0 ? 0 : numel(input) / cols;
    if (!tilable(cols)) return kTilingError;
    bool has_weight = weight, has_bias = bias, has_mean = mean, has_rstd = rstd;
    return plan({input, weight, bias}, {out, mean, rstd},
                [rows, cols, eps, has_weight, has_bias, has_mean, has_rstd](aclTensor *t) {
        for (int64_t r = 0; r < rows; ++r) {
            double mu, var;
            rowMoments(&t[0], r, cols, &mu, &var);
            double inv = 1.0 / std::sqrt(var + eps);
            for (int64_t c = 0; c < cols; ++c) {
                double w = has_weight ? load(&t[1], c) : 1.0, b = has_bias ? load(&t[2], c) : 0.0;
                store(&t[3], r * cols + c, (load(&t[0], r * cols + c) - mu) * inv * w + b);
            }
            if (has_mean) store(&t[4], r, mu);
            if (has_rstd) store(&t[5], r, inv);
        }
    }, ws, ex);
}

EMULATED_SECOND_PHASE(aclnnLayerNorm)

// aclnnBatchNormBackward: channel axis 1, format by rank (NC, NCL, NCHW, NCDHW, ND), strided views allowed,
// per-channel tensors FLOAT (the strictest documented version), empty tensors allowed. weight, the running and
// the saved statistics are optional ("non-null" is when their checks apply); weight NULL is ones. Training
// reads saveMean / saveInvstd, eval runningMean / runningVar with eps, so the ones the mode reads must be
// given (the documents define no default for them): 161002 otherwise. Outputs not asked for are not written.
// saveInvstd is read as what aclnnBatchNorm writes there (savesInvstd): 1/sqrt(var + eps) on Ascend 950 (CANN's
// regbase path hands it to BatchNormGradV3), the biased batch variance elsewhere (its A2/A3 path hands it to
// BNTrainingUpdateGrad / BNTrainingReduceGrad as their batch_variance, and its document's formula takes
// sqrt(saveVar + eps)).
aclnnStatus aclnnBatchNormBackwardGetWorkspaceSize(const aclTensor *grad_out, const aclTensor *input,
                                                   const aclTensor *weight, const aclTensor *running_mean,
                                                   const aclTensor *running_var, const aclTensor *save_mean,
                                                   const aclTensor *save_invstd, bool training, double eps,
                                                   const aclBoolArray *mask, aclTensor *grad_input,
                                                   aclTensor *grad_weight, aclTensor *grad_bias, uint64_t *ws,
                                                   aclOpExecutor **ex) {
    if (!grad_out || !input || !mask || !ws || !ex) return kParamNullptr;
    if (mask->values.size() != 3) return kParamInvalid;
    const std::vector<bool> want = mask->values;
    if ((want[0] && !grad_input) || (want[1] && !grad_weight) || (want[2] && !grad_bias)) return kParamNullptr;
    if (training ? (!save_mean || !save_invstd) : (!running_mean || !running_var)) return kParamInvalid;
    int dt = input->dtype;
    size_t rank = input->shape.size();
    if (!isFloat(dt) || grad_out->dtype != dt || rank < 2 || rank > 8) return kParamInvalid;
    if (grad_out->shape != input->shape) return kTilingError;
    if (want[0] && grad_input->dtype != dt) return kParamInvalid;
    if (want[0] && grad_input->shape != input->shape) return kTilingError;
    for (const aclTensor *t : {grad_out, input, want[0] ? (const aclTensor *)grad_input : nullptr}) {
        if (t && t->format != bnFormatFor(rank)) return kParamInvalid;
    }
    int64_t channels = input->shape[1];
    for (const aclTensor *t : {weight, running_mean, running_var, save_mean, save_invstd,
                               want[1] ? (const aclTensor *)grad_weight : nullptr,
                               want[2] ? (const aclTensor *)grad_bias : nullptr}) {
        if (t && t->dtype != kFloat) return kParamInvalid;
        if (t && t->shape != std::vector<int64_t>{channels}) return kTilingError;
    }
    int64_t batch = input->shape[0], length = product(input->shape, 2, rank);
    if (!tilable(batch * length)) return kTilingError;
    bool has_weight = weight != nullptr, invstd_saved = savesInvstd();
    return plan({grad_out, input, weight, running_mean, running_var, save_mean, save_invstd},
                {grad_input, grad_weight, grad_bias},
                [batch, channels, length, training, eps, has_weight, invstd_saved, want](aclTensor *t) {
        double count = static_cast<double>(batch * length);
        for (int64_t c = 0; c < channels; ++c) {
            double mean = training ? load(&t[5], c) : load(&t[3], c);
            double spread = training ? load(&t[6], c) : load(&t[4], c); // saveInvstd: see above
            double inv = training && invstd_saved ? spread : 1.0 / std::sqrt(spread + eps);
            double w = has_weight ? load(&t[2], c) : 1.0, sum = 0, sum_x = 0;
            for (int64_t n = 0; n < batch; ++n) {
                for (int64_t l = 0; l < length; ++l) {
                    int64_t i = (n * channels + c) * length + l;
                    double go = load(&t[0], i);
                    sum += go;
                    sum_x += go * (load(&t[1], i) - mean) * inv;
                }
            }
            for (int64_t n = 0; n < batch && want[0]; ++n) {
                for (int64_t l = 0; l < length; ++l) {
                    int64_t i = (n * channels + c) * length + l;
                    double go = load(&t[0], i), xhat = (load(&t[1], i) - mean) * inv;
                    double gi = training ? w * inv * (go - sum / count - xhat * sum_x / count) : go * inv * w;
                    store(&t[7], i, gi);
                }
            }
            if (want[1]) store(&t[8], c, sum_x);
            if (want[2]) store(&t[9], c, sum);
        }
    }, ws, ex);
}

EMULATED_SECOND_PHASE(aclnnBatchNormBackward)

// aclnnBatchNorm: channel axis 1, strided views allowed. Training normalizes with the batch statistics, writes
// saveMean and saveInvstd (see savesInvstd) and updates runningMean / runningVar to (1 - momentum) * running +
// momentum * batch, the variance unbiased (M / (M - 1); 0 for M = 1, as BNTrainingUpdate documents); eval
// normalizes with the running statistics. Absent weight, bias, runningMean, runningVar: ones, zeros, zeros, ones,
// the running ones then not written. An empty input writes saveMean = 0 and saveInvstd = NaN, as CANN's first
// phase does.
aclnnStatus aclnnBatchNormGetWorkspaceSize(const aclTensor *input, const aclTensor *weight, const aclTensor *bias,
                                           aclTensor *running_mean, aclTensor *running_var, bool training,
                                           double momentum, double eps, aclTensor *output, aclTensor *save_mean,
                                           aclTensor *save_invstd, uint64_t *ws, aclOpExecutor **ex) {
    if (!input || !output || !ws || !ex || (training && (!save_mean || !save_invstd))) return kParamNullptr;
    const aclTensor *saves[2] = {training ? save_mean : nullptr, training ? save_invstd : nullptr};
    if (!batchNormArgumentsOk(input, output, {weight, bias, running_mean, running_var, saves[0], saves[1]})) {
        return kParamInvalid;
    }
    int64_t batch = input->shape[0], channels = input->shape[1], length = product(input->shape, 2, input->shape.size());
    if (!tilable(batch * length)) return kTilingError;
    bool has[4] = {weight != nullptr, bias != nullptr, running_mean != nullptr, running_var != nullptr};
    bool invstd_saved = savesInvstd();
    return plan({input, weight, bias, running_mean, running_var}, {output, save_mean, save_invstd},
                [=](aclTensor *t) {
        double count = static_cast<double>(batch * length);
        for (int64_t c = 0; c < channels; ++c) {
            double mean = has[2] ? load(&t[3], c) : 0.0, var = has[3] ? load(&t[4], c) : 1.0;
            if (training && count > 0) channelMoments(&t[0], batch, channels, length, c, &mean, &var);
            double inv = 1.0 / std::sqrt(var + eps);
            double scale = inv * (has[0] ? load(&t[1], c) : 1.0), shift = has[1] ? load(&t[2], c) : 0.0;
            for (int64_t i = 0; i < batch * length; ++i) {
                int64_t at = ((i / length) * channels + c) * length + i % length;
                store(&t[5], at, (load(&t[0], at) - mean) * scale + shift);
            }
            if (!training) continue;
            if (count == 0) {
                store(&t[6], c, 0.0);
                store(&t[7], c, std::nan(""));
                continue;
            }
            store(&t[6], c, mean);
            store(&t[7], c, invstd_saved ? inv : var);
            double unbiased = count > 1 ? var * count / (count - 1) : 0.0;
            if (has[2]) store(&t[3], c, (1 - momentum) * load(&t[3], c) + momentum * mean);
            if (has[3]) store(&t[4], c, (1 - momentum) * load(&t[4], c) + momentum * unbiased);
        }
    }, ws, ex);
}

EMULATED_SECOND_PHASE(aclnnBatchNorm)

} // extern "C"
