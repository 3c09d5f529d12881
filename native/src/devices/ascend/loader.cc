#include "loader.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

namespace ascend {
namespace {

std::vector<std::string> candidatePaths(const char *library) {
    std::vector<std::string> paths;
    auto under = [&](const char *variable, std::initializer_list<const char *> subdirs) {
        const char *root = std::getenv(variable);
        if (root == nullptr || *root == '\0') return;
        for (const char *subdir : subdirs) paths.push_back(std::string(root) + "/" + subdir + "/" + library);
    };
    under("ASCEND_TOOLKIT_HOME", {"lib64", "lib"});
    under("ASCEND_HOME", {"lib64", "lib", "ascend-toolkit/latest/lib64"});
    paths.push_back(library); // the loader's own search path
    return paths;
}

// RTLD_GLOBAL: libopapi needs libnnopbase's symbols, found by soname once it is loaded.
void *openFirst(const char *library) {
    for (const std::string &path : candidatePaths(library)) {
        if (void *handle = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL)) return handle;
    }
    return nullptr;
}

template <typename Fn>
bool resolve(void *library, const char *name, Fn *&slot) {
    slot = reinterpret_cast<Fn *>(dlsym(library, name));
    return slot != nullptr;
}

infiniStatus_t load(Api *api) {
    void *acl = openFirst("libascendcl.so");
    if (acl == nullptr) return INFINI_STATUS_DEVICE_NOT_FOUND;
    void *nnopbase = openFirst("libnnopbase.so");
    if (nnopbase == nullptr) return INFINI_STATUS_DEVICE_NOT_FOUND;
    void *opapi = openFirst("libopapi.so");
    if (opapi == nullptr) return INFINI_STATUS_DEVICE_NOT_FOUND;

#define RESOLVE(library, name) ok = resolve(library, #name, api->name) && ok
    bool ok = true;
    RESOLVE(acl, aclInit);
    RESOLVE(acl, aclrtGetDeviceCount);
    RESOLVE(acl, aclrtSetDevice);
    RESOLVE(acl, aclrtSynchronizeDevice);
    RESOLVE(acl, aclrtCreateStream);
    RESOLVE(acl, aclrtDestroyStream);
    RESOLVE(acl, aclrtSynchronizeStream);
    RESOLVE(acl, aclrtMalloc);
    RESOLVE(acl, aclrtMallocHost);
    RESOLVE(acl, aclrtFree);
    RESOLVE(acl, aclrtFreeHost);
    RESOLVE(acl, aclrtMemcpy);
    RESOLVE(acl, aclrtMemcpyAsync);
    RESOLVE(acl, aclrtMemset);
    RESOLVE(acl, aclrtMemsetAsync);
    RESOLVE(nnopbase, aclCreateTensor);
    RESOLVE(nnopbase, aclDestroyTensor);
    RESOLVE(nnopbase, aclCreateIntArray);
    RESOLVE(nnopbase, aclDestroyIntArray);
    RESOLVE(nnopbase, aclCreateBoolArray);
    RESOLVE(nnopbase, aclDestroyBoolArray);
    RESOLVE(nnopbase, aclCreateScalar);
    RESOLVE(nnopbase, aclDestroyScalar);
    RESOLVE(nnopbase, aclSetAclOpExecutorRepeatable);
    RESOLVE(nnopbase, aclDestroyAclOpExecutor);
    RESOLVE(nnopbase, aclSetInputTensorAddr);
    RESOLVE(nnopbase, aclSetOutputTensorAddr);
    RESOLVE(opapi, aclnnRmsNormGetWorkspaceSize);
    RESOLVE(opapi, aclnnRmsNorm);
    RESOLVE(opapi, aclnnRmsNormGradGetWorkspaceSize);
    RESOLVE(opapi, aclnnRmsNormGrad);
    RESOLVE(opapi, aclnnLayerNormBackwardGetWorkspaceSize);
    RESOLVE(opapi, aclnnLayerNormBackward);
    RESOLVE(opapi, aclnnBatchNormBackwardGetWorkspaceSize);
    RESOLVE(opapi, aclnnBatchNormBackward);
    RESOLVE(opapi, aclnnCastGetWorkspaceSize);
    RESOLVE(opapi, aclnnCast);
    RESOLVE(opapi, aclnnAddsGetWorkspaceSize);
    RESOLVE(opapi, aclnnAdds);
    RESOLVE(opapi, aclnnRsqrtGetWorkspaceSize);
    RESOLVE(opapi, aclnnRsqrt);
    RESOLVE(opapi, aclnnDivGetWorkspaceSize);
    RESOLVE(opapi, aclnnDiv);
#undef RESOLVE
    if (!ok) return INFINI_STATUS_DEVICE_NOT_FOUND;

    aclError status = api->aclInit(nullptr);
    if (status != kAclSuccess && status != kAclRepeatInitialize) return fromAcl(status);
    return INFINI_STATUS_SUCCESS;
}

} // namespace

infiniStatus_t api(const Api **out) {
    // Loaded once per process; the libraries stay loaded (CANN does not support being unloaded and reloaded).
    static Api table{};
    static infiniStatus_t status = INFINI_STATUS_INTERNAL_ERROR;
    static std::once_flag once;
    std::call_once(once, [] { status = load(&table); });
    if (status != INFINI_STATUS_SUCCESS) return status;
    *out = &table;
    return INFINI_STATUS_SUCCESS;
}

infiniStatus_t fromAcl(int code) {
    switch (code) {
    case 0: return INFINI_STATUS_SUCCESS;
    case 100001: return INFINI_STATUS_DEVICE_NOT_INITIALIZED; // ACL_ERROR_UNINITIALIZE
    case 107001: return INFINI_STATUS_DEVICE_NOT_FOUND;       // ACL_ERROR_RT_INVALID_DEVICEID
    case 161001: return INFINI_STATUS_NULL_POINTER;           // ACLNN_ERR_PARAM_NULLPTR
    case 161002: return INFINI_STATUS_BAD_PARAM;              // ACLNN_ERR_PARAM_INVALID
    default: break;
    }
    // Parameter errors are ours to fix; resource, runtime and internal errors are not.
    return code >= 100000 && code < 200000 ? INFINI_STATUS_BAD_PARAM : INFINI_STATUS_INTERNAL_ERROR;
}

} // namespace ascend
