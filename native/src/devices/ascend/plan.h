// A fixed sequence of aclnn calls planned once per op descriptor and launched on every run.
// Each call's executor is built at plan time on tensors without addresses and made repeatable; a run only
// points its tensors at this call's buffers. Where CANN refuses repeatability (or a buffer is not 32-byte
// aligned, which re-pointing requires) that call is planned again on each run instead.
// Everything runs in the plan's device context (context.h). Launches are asynchronous: the plan remembers, per
// stream it ran on, an event after its last run there, and its destruction waits for those before freeing what
// the queued kernels read (aclrtFree does not wait for anything).
#ifndef INFINI_DEVICES_ASCEND_PLAN_H
#define INFINI_DEVICES_ASCEND_PLAN_H

#include "loader.h"

#include "common/checked.h"

#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

namespace ascend {

aclDataType aclDtypeOf(infiniDtype_t dtype);

// Where a tensor's data is at run time.
struct Buffer {
    enum Kind { Argument, Scratch, Constant };
    Kind kind;
    size_t index;      // Argument: position in the run's pointer list; Scratch/Constant: byte offset
    static Buffer argument(size_t i) { return {Argument, i}; }
    static Buffer scratch(size_t offset) { return {Scratch, offset}; }
    static Buffer constant(size_t offset) { return {Constant, offset}; }
};

// A tensor view: element strides (non-negative), format, dtype and where its data is.
struct TensorSpec {
    std::vector<int64_t> shape;
    std::vector<int64_t> strides;
    aclDataType dtype;
    Buffer buffer;
    aclFormat format = ACL_FORMAT_ND;

    static TensorSpec contiguous(std::vector<int64_t> shape, aclDataType dtype, Buffer buffer,
                                 aclFormat format = ACL_FORMAT_ND);
};

// One aclnn operator: plan(tensors, &workspace, &executor) with inputs then outputs in prototype order. An
// absent optional tensor (std::nullopt) is a nullptr at its position: re-pointing indices count it, as CANN's do.
// launch is NULL where this CANN install lacks the operator (loader.h): build() is then NOT_IMPLEMENTED.
struct Call {
    using Prepare = std::function<aclnnStatus(aclTensor *const *tensors, uint64_t *workspace, aclOpExecutor **)>;
    using Launch = aclnnStatus (*)(void *workspace, uint64_t size, aclOpExecutor *executor, aclrtStream stream);
    std::vector<std::optional<TensorSpec>> inputs, outputs;
    Prepare prepare;
    Launch launch;
};

class Plan {
  public:
    Plan(const Api *api, int device) : api_(api), device_(device) {}
    ~Plan(); // waits for the plan's queued work (see above), then frees
    Plan(const Plan &) = delete;
    Plan &operator=(const Plan &) = delete;

    const Api &acl() const { return *api_; }
    // Reserves an aligned region of scratch workspace; returns its byte offset. A size past size_t makes build()
    // return BAD_TENSOR_SHAPE.
    size_t reserveScratch(infini::CheckedSize bytes);
    // Device memory owned by the plan, written once now; returns its byte offset among the constants.
    size_t addConstant(const void *host, size_t bytes);
    // Arrays owned by the plan, alive as long as its executors.
    const aclIntArray *intArray(const std::vector<int64_t> &values);
    const aclBoolArray *boolArray(const std::vector<bool> &values);
    const aclScalar *floatScalar(float value);
    void add(Call call) {
        calls_.emplace_back();
        calls_.back().call = std::move(call);
    }
    // Sets the `count` packed elements (of `dtype`) at argument `index` to `value` first on every run: outputs of
    // reductions over no elements, which aclnn refuses (empty sums, statistics of empty rows).
    void addFill(size_t index, aclDataType dtype, size_t count, float value);

    // Uploads the constants and plans every call; after this, workspaceSize() is final.
    infiniStatus_t build();
    size_t workspaceSize() const { return aclnn_offset_ + aclnn_bytes_; }
    // args: the run's data pointers, indexed by Buffer::argument.
    infiniStatus_t run(void *workspace, const std::vector<const void *> &args, aclrtStream stream) const;

  private:
    struct Stage {
        Call call;
        std::vector<aclTensor *> tensors; // inputs then outputs, created without data; nullptr where absent
        aclOpExecutor *executor = nullptr;
        bool repeatable = false;
        uint64_t workspace = 0;
    };

    aclTensor *createTensor(const TensorSpec &spec, void *data) const;
    void *address(const Buffer &buffer, void *workspace, const std::vector<const void *> &args) const;
    infiniStatus_t runRepeatable(const Stage &stage, const std::vector<void *> &addresses, void *aclnn_workspace,
                                 aclrtStream stream) const;
    infiniStatus_t runOnce(const Stage &stage, const std::vector<void *> &addresses, void *aclnn_workspace,
                           aclrtStream stream) const;
    infiniStatus_t buildOnDevice();
    infiniStatus_t launchAll(void *workspace, const std::vector<const void *> &args, aclrtStream stream) const;
    infiniStatus_t launchFills(const std::vector<const void *> &args, aclrtStream stream) const;
    bool readsPlanMemory() const;
    infiniStatus_t recordRun(aclrtStream stream) const;
    void waitForRuns() const;

    const Api *api_;
    const int device_;
    std::vector<Stage> calls_;
    struct Fill {
        size_t index, bytes;
        std::optional<size_t> constant; // the value's copies among the constants; none: zeros
    };
    std::vector<Fill> fills_;
    std::vector<const aclIntArray *> int_arrays_;
    std::vector<const aclBoolArray *> bool_arrays_;
    std::vector<const aclScalar *> scalars_;
    std::deque<float> scalar_values_; // stable addresses: a scalar may keep pointing at its value
    std::vector<unsigned char> constants_host_;
    void *constants_ = nullptr;
    size_t scratch_bytes_ = 0;
    bool scratch_overflowed_ = false;
    size_t aclnn_offset_ = 0, aclnn_bytes_ = 0;
    mutable std::mutex run_mutex_; // re-pointing executors is not thread-safe; guards runs_ too
    // Per stream run on: an event recorded after the last run there. A stream whose event could not be recorded
    // makes the destruction wait for the whole device instead.
    mutable std::vector<std::pair<aclrtStream, aclrtEvent>> runs_;
    mutable bool unrecorded_run_ = false;
};

} // namespace ascend

#endif
