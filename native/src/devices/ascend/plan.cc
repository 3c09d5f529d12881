#include "plan.h"

#include "context.h"

#include "common/status.h"
#include "devices/cpu/half.h"

#include <cmath>
#include <cstdint>
#include <cstring>

namespace ascend {
namespace {

// Region alignment: aclSetInputTensorAddr needs 32 bytes; 512 matches what aclrtMalloc returns.
constexpr size_t kAlign = 512;

size_t alignUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

bool isContiguous(const TensorSpec &spec) {
    int64_t expected = 1;
    for (size_t i = spec.shape.size(); i-- > 0;) {
        if (spec.shape[i] != 1 && spec.strides[i] != expected) return false;
        expected *= spec.shape[i];
    }
    return true;
}

size_t elementBytes(aclDataType dtype) { return dtype == ACL_FLOAT ? 4 : 2; }

// `count` copies of `value` as the device stores `dtype`.
std::vector<unsigned char> repeated(aclDataType dtype, float value, size_t count) {
    uint16_t half = 0;
    if (dtype == ACL_FLOAT16) half = cpu::fromFloat<cpu::f16_t>(value).bits;
    if (dtype == ACL_BF16) half = cpu::fromFloat<cpu::bf16_t>(value).bits;
    const void *element = dtype == ACL_FLOAT ? static_cast<const void *>(&value) : &half;
    const size_t size = elementBytes(dtype);
    std::vector<unsigned char> bytes(count * size);
    for (size_t i = 0; i < count; ++i) std::memcpy(bytes.data() + i * size, element, size);
    return bytes;
}

} // namespace

aclDataType aclDtypeOf(infiniDtype_t dtype) {
    switch (dtype) {
    case INFINI_DTYPE_F16: return ACL_FLOAT16;
    case INFINI_DTYPE_BF16: return ACL_BF16;
    default: return ACL_FLOAT;
    }
}

TensorSpec TensorSpec::contiguous(std::vector<int64_t> shape, aclDataType dtype, Buffer buffer, aclFormat format) {
    std::vector<int64_t> strides(shape.size());
    int64_t stride = 1;
    for (size_t i = shape.size(); i-- > 0;) {
        strides[i] = stride;
        stride *= shape[i];
    }
    return TensorSpec{std::move(shape), std::move(strides), dtype, buffer, format};
}

Plan::~Plan() {
    // A destructor has no status to return: what fails here can only be skipped.
    onDevice(*api_, device_, [&] {
        waitForRuns();
        for (Stage &stage : calls_) {
            if (stage.executor != nullptr) api_->aclDestroyAclOpExecutor(stage.executor);
            for (aclTensor *tensor : stage.tensors) {
                if (tensor != nullptr) api_->aclDestroyTensor(tensor);
            }
        }
        for (const aclIntArray *array : int_arrays_) api_->aclDestroyIntArray(array);
        for (const aclBoolArray *array : bool_arrays_) api_->aclDestroyBoolArray(array);
        for (const aclScalar *scalar : scalars_) api_->aclDestroyScalar(scalar);
        if (constants_ != nullptr) api_->aclrtFree(constants_);
        return INFINI_STATUS_SUCCESS;
    });
}

// Waits for every run's queued kernels: they may still read the constants and executors about to be freed.
void Plan::waitForRuns() const {
    for (const auto &run : runs_) {
        api_->aclrtSynchronizeEvent(run.second);
        api_->aclrtDestroyEvent(run.second);
    }
    runs_.clear();
    if (unrecorded_run_) api_->aclrtSynchronizeDevice();
}

// Marks the end of this run's work on `stream`: an event per stream, recorded again by each run there. Events
// of other streams whose work is done are dropped first, so a plan run on many streams keeps few.
infiniStatus_t Plan::recordRun(aclrtStream stream) const {
    auto found = runs_.begin();
    while (found != runs_.end() && found->first != stream) ++found;
    if (found == runs_.end()) {
        for (auto it = runs_.begin(); it != runs_.end();) {
            aclrtEventRecordedStatus done = ACL_EVENT_RECORDED_STATUS_NOT_READY;
            if (api_->aclrtQueryEventStatus(it->second, &done) == kAclSuccess &&
                done == ACL_EVENT_RECORDED_STATUS_COMPLETE) {
                api_->aclrtDestroyEvent(it->second);
                it = runs_.erase(it);
            } else {
                ++it;
            }
        }
        aclrtEvent event = nullptr;
        aclError created = api_->aclrtCreateEvent(&event);
        if (created != kAclSuccess) {
            unrecorded_run_ = true;
            return fromAcl(created);
        }
        runs_.emplace_back(stream, event);
        found = runs_.end() - 1;
    }
    aclError recorded = api_->aclrtRecordEvent(found->second, stream);
    if (recorded != kAclSuccess) unrecorded_run_ = true;
    return fromAcl(recorded);
}

size_t Plan::reserveScratch(infini::CheckedSize bytes) {
    if ((infini::CheckedSize(scratch_bytes_) + bytes + kAlign).overflowed()) {
        scratch_overflowed_ = true;
        return 0;
    }
    size_t offset = scratch_bytes_;
    scratch_bytes_ += alignUp(bytes.value());
    return offset;
}

size_t Plan::addConstant(const void *host, size_t bytes) {
    size_t offset = constants_host_.size();
    const auto *begin = static_cast<const unsigned char *>(host);
    constants_host_.insert(constants_host_.end(), begin, begin + bytes);
    constants_host_.resize(alignUp(constants_host_.size()));
    return offset;
}

void Plan::addFill(size_t index, aclDataType dtype, size_t count, float value) {
    const size_t bytes = count * elementBytes(dtype);
    if (value == 0.0f && !std::signbit(value)) {
        fills_.push_back({index, bytes, std::nullopt});
        return;
    }
    const std::vector<unsigned char> copies = repeated(dtype, value, count);
    fills_.push_back({index, bytes, addConstant(copies.data(), bytes)});
}

const aclIntArray *Plan::intArray(const std::vector<int64_t> &values) {
    int_arrays_.push_back(api_->aclCreateIntArray(values.data(), values.size()));
    return int_arrays_.back();
}

const aclBoolArray *Plan::boolArray(const std::vector<bool> &values) {
    bool flags[8];
    for (size_t i = 0; i < values.size() && i < 8; ++i) flags[i] = values[i];
    bool_arrays_.push_back(api_->aclCreateBoolArray(flags, values.size()));
    return bool_arrays_.back();
}

const aclScalar *Plan::floatScalar(float value) {
    scalar_values_.push_back(value);
    scalars_.push_back(api_->aclCreateScalar(&scalar_values_.back(), ACL_FLOAT));
    return scalars_.back();
}

aclTensor *Plan::createTensor(const TensorSpec &spec, void *data) const {
    // Storage: the view itself when contiguous, else the 1-D span the strided view reaches.
    std::vector<int64_t> storage = spec.shape;
    if (!isContiguous(spec)) {
        int64_t span = 1;
        for (size_t i = 0; i < spec.shape.size(); ++i) {
            if (spec.shape[i] == 0) span = 0;
            if (span > 0) span += (spec.shape[i] - 1) * spec.strides[i];
        }
        storage = {span};
    }
    return api_->aclCreateTensor(spec.shape.data(), spec.shape.size(), spec.dtype, spec.strides.data(), 0, spec.format,
                                 storage.data(), storage.size(), data);
}

infiniStatus_t Plan::build() {
    if (scratch_overflowed_) return INFINI_STATUS_BAD_TENSOR_SHAPE; // a workspace past 2^64 bytes
    for (const Stage &stage : calls_) {
        if (stage.call.launch == nullptr) return INFINI_STATUS_NOT_IMPLEMENTED; // not in this CANN install
    }
    return onDevice(*api_, device_, [&] { return buildOnDevice(); });
}

infiniStatus_t Plan::buildOnDevice() {
    for (const Stage &stage : calls_) {
        for (const auto *group : {&stage.call.inputs, &stage.call.outputs}) {
            for (const std::optional<TensorSpec> &spec : *group) {
                if (spec && spec->buffer.kind == Buffer::Constant && spec->buffer.index >= constants_host_.size()) {
                    return INFINI_STATUS_INTERNAL_ERROR;
                }
            }
        }
    }
    if (!constants_host_.empty()) {
        ACL_CHECK(api_->aclrtMalloc(&constants_, constants_host_.size(), ACL_MEM_MALLOC_HUGE_FIRST));
        ACL_CHECK(api_->aclrtMemcpy(constants_, constants_host_.size(), constants_host_.data(), constants_host_.size(),
                                    ACL_MEMCPY_HOST_TO_DEVICE));
    }
    for (Stage &stage : calls_) {
        for (const auto *group : {&stage.call.inputs, &stage.call.outputs}) {
            for (const std::optional<TensorSpec> &spec : *group) {
                aclTensor *tensor = spec ? createTensor(*spec, nullptr) : nullptr;
                if (spec && tensor == nullptr) return INFINI_STATUS_INTERNAL_ERROR;
                stage.tensors.push_back(tensor);
            }
        }
        ACL_CHECK(stage.call.prepare(stage.tensors.data(), &stage.workspace, &stage.executor));
        stage.repeatable = api_->aclSetAclOpExecutorRepeatable(stage.executor) == 0;
        if (!stage.repeatable) {
            // Planned again on every run; this executor was only needed for the workspace size.
            api_->aclDestroyAclOpExecutor(stage.executor);
            stage.executor = nullptr;
        }
        if (stage.workspace > aclnn_bytes_) aclnn_bytes_ = stage.workspace;
    }
    aclnn_offset_ = scratch_bytes_;
    return INFINI_STATUS_SUCCESS;
}

void *Plan::address(const Buffer &buffer, void *workspace, const std::vector<const void *> &args) const {
    switch (buffer.kind) {
    case Buffer::Argument: return const_cast<void *>(args[buffer.index]);
    case Buffer::Scratch: return static_cast<char *>(workspace) + buffer.index;
    case Buffer::Constant: return static_cast<char *>(constants_) + buffer.index;
    }
    return nullptr;
}

infiniStatus_t Plan::runRepeatable(const Stage &stage, const std::vector<void *> &addresses, void *aclnn_workspace,
                                   aclrtStream stream) const {
    const size_t inputs = stage.call.inputs.size();
    for (size_t i = 0; i < stage.tensors.size(); ++i) {
        if (stage.tensors[i] == nullptr) continue; // absent: nothing to re-point
        if (i < inputs) {
            ACL_CHECK(api_->aclSetInputTensorAddr(stage.executor, i, stage.tensors[i], addresses[i]));
        } else {
            ACL_CHECK(api_->aclSetOutputTensorAddr(stage.executor, i - inputs, stage.tensors[i], addresses[i]));
        }
    }
    ACL_CHECK(stage.call.launch(aclnn_workspace, stage.workspace, stage.executor, stream));
    return INFINI_STATUS_SUCCESS;
}

infiniStatus_t Plan::runOnce(const Stage &stage, const std::vector<void *> &addresses, void *aclnn_workspace,
                             aclrtStream stream) const {
    std::vector<aclTensor *> tensors;
    auto destroy = [&] {
        for (aclTensor *tensor : tensors) {
            if (tensor != nullptr) api_->aclDestroyTensor(tensor);
        }
    };
    size_t i = 0;
    for (const auto *group : {&stage.call.inputs, &stage.call.outputs}) {
        for (const std::optional<TensorSpec> &spec : *group) {
            aclTensor *tensor = spec ? createTensor(*spec, addresses[i]) : nullptr;
            ++i;
            if (spec && tensor == nullptr) {
                destroy();
                return INFINI_STATUS_INTERNAL_ERROR;
            }
            tensors.push_back(tensor);
        }
    }
    uint64_t workspace = 0;
    aclOpExecutor *executor = nullptr;
    int status = stage.call.prepare(tensors.data(), &workspace, &executor);
    if (status == 0 && workspace > aclnn_bytes_) status = -1; // planned with less than it now asks for
    if (status == 0) {
        status = stage.call.launch(aclnn_workspace, workspace, executor, stream);
    } else if (executor != nullptr) {
        api_->aclDestroyAclOpExecutor(executor);
    }
    destroy();
    return status == -1 ? INFINI_STATUS_INTERNAL_ERROR : fromAcl(status);
}

infiniStatus_t Plan::run(void *workspace, const std::vector<const void *> &args, aclrtStream stream) const {
    std::lock_guard<std::mutex> lock(run_mutex_);
    return onDevice(*api_, device_, [&] {
        infiniStatus_t launched = launchAll(workspace, args, stream);
        // Recorded even when a launch failed, after others were queued: the plan's memory must outlive what reads it.
        infiniStatus_t recorded = readsPlanMemory() ? recordRun(stream) : INFINI_STATUS_SUCCESS;
        return launched != INFINI_STATUS_SUCCESS ? launched : recorded;
    });
}

// Launched kernels read the executors and constants; a fill of a value other than zero reads the constants.
bool Plan::readsPlanMemory() const {
    bool copies = false;
    for (const Fill &fill : fills_) copies = copies || fill.constant.has_value();
    return copies || !calls_.empty();
}

infiniStatus_t Plan::launchFills(const std::vector<const void *> &args, aclrtStream stream) const {
    for (const Fill &fill : fills_) {
        void *target = const_cast<void *>(args[fill.index]);
        if (fill.constant) {
            const void *copies = static_cast<const char *>(constants_) + *fill.constant;
            ACL_CHECK(api_->aclrtMemcpyAsync(target, fill.bytes, copies, fill.bytes, ACL_MEMCPY_DEVICE_TO_DEVICE,
                                             stream));
        } else {
            ACL_CHECK(api_->aclrtMemsetAsync(target, fill.bytes, 0, fill.bytes, stream));
        }
    }
    return INFINI_STATUS_SUCCESS;
}

infiniStatus_t Plan::launchAll(void *workspace, const std::vector<const void *> &args, aclrtStream stream) const {
    void *aclnn_workspace = aclnn_bytes_ > 0 ? static_cast<char *>(workspace) + aclnn_offset_ : nullptr;
    INFINI_CHECK(launchFills(args, stream));
    for (const Stage &stage : calls_) {
        std::vector<void *> addresses;
        bool aligned = true;
        for (const auto *group : {&stage.call.inputs, &stage.call.outputs}) {
            for (const std::optional<TensorSpec> &spec : *group) {
                void *data = spec ? address(spec->buffer, workspace, args) : nullptr;
                aligned = aligned && reinterpret_cast<uintptr_t>(data) % 32 == 0;
                addresses.push_back(data);
            }
        }
        if (stage.repeatable && aligned) {
            INFINI_CHECK(runRepeatable(stage, addresses, aclnn_workspace, stream));
        } else {
            INFINI_CHECK(runOnce(stage, addresses, aclnn_workspace, stream));
        }
    }
    return INFINI_STATUS_SUCCESS;
}

} // namespace ascend
