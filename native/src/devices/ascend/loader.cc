#include "loader.h"

#include <dirent.h>
#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace ascend {
namespace {

// The directories a CANN install's libraries are looked for in, in order.
std::vector<std::string> searchDirectories() {
    std::vector<std::string> directories;
    auto under = [&](const char *variable, std::initializer_list<const char *> subdirs) {
        const char *root = std::getenv(variable);
        if (root == nullptr || *root == '\0') return;
        for (const char *subdir : subdirs) directories.push_back(std::string(root) + "/" + subdir);
    };
    under("ASCEND_TOOLKIT_HOME", {"lib64", "lib"});
    under("ASCEND_HOME_PATH", {"lib64", "lib"}); // what torch_npu reads; set_env.sh sets both
    under("ASCEND_HOME", {"lib64", "lib", "ascend-toolkit/latest/lib64"});
    return directories;
}

std::vector<std::string> candidatePaths(const char *library) {
    std::vector<std::string> paths;
    for (const std::string &directory : searchDirectories()) paths.push_back(directory + "/" + library);
    paths.push_back(library); // the loader's own search path
    return paths;
}

void *openFirst(const std::vector<std::string> &paths, int mode) {
    for (const std::string &path : paths) {
        if (void *handle = dlopen(path.c_str(), mode)) return handle;
    }
    return nullptr;
}

// Current CANN's per-package operator libraries (libopapi_nn.so, libopapi_math.so, ...): every libopapi_*.so in
// the search directories, then in LD_LIBRARY_PATH's (where set_env.sh puts lib64), in name order; the first
// directory holding a name wins.
std::vector<std::string> splitOperatorLibraries() {
    std::vector<std::string> directories = searchDirectories();
    if (const char *path = std::getenv("LD_LIBRARY_PATH")) {
        for (const char *begin = path; *begin != '\0';) {
            const char *end = std::strchr(begin, ':');
            size_t length = end == nullptr ? std::strlen(begin) : static_cast<size_t>(end - begin);
            if (length > 0) directories.emplace_back(begin, length);
            begin += length + (end == nullptr ? 0 : 1);
        }
    }
    std::map<std::string, std::string> found; // name -> path
    for (const std::string &directory : directories) {
        DIR *listing = opendir(directory.c_str());
        if (listing == nullptr) continue;
        while (const dirent *entry = readdir(listing)) {
            const std::string name = entry->d_name;
            const bool split = name.size() > 12 && name.compare(0, 9, "libopapi_") == 0 &&
                               name.compare(name.size() - 3, 3, ".so") == 0;
            if (split) found.emplace(name, directory + "/" + name);
        }
        closedir(listing);
    }
    std::vector<std::string> paths;
    for (const auto &entry : found) paths.push_back(entry.second);
    return paths;
}

// The operator libraries in torch_npu's search order, each opened only when a symbol is not in those before it
// (the deprecated libopapi.so is large). RTLD_LOCAL: their symbols are looked up here, never by others.
class OperatorLibraries {
  public:
    OperatorLibraries() {
        for (const std::string &path : splitOperatorLibraries()) candidates_.push_back({path});
        for (const char *name : {"libopapi.so", "libaclnn_ops_train.so", "libaclnn_math.so"}) {
            candidates_.push_back(candidatePaths(name));
        }
    }

    void *find(const char *symbol) {
        for (size_t i = 0; i < candidates_.size(); ++i) {
            if (i == handles_.size()) handles_.push_back(openFirst(candidates_[i], RTLD_LAZY | RTLD_LOCAL));
            if (handles_[i] == nullptr) continue;
            if (void *address = dlsym(handles_[i], symbol)) return address;
        }
        return nullptr;
    }

  private:
    std::vector<std::vector<std::string>> candidates_; // per library, the paths to try
    std::vector<void *> handles_;                      // per library opened so far; nullptr: not found
};

template <typename Fn>
bool resolve(void *library, const char *name, Fn *&slot) {
    slot = reinterpret_cast<Fn *>(dlsym(library, name));
    return slot != nullptr;
}

// Both phases of an aclnn operator, or neither: one without the other cannot be called.
template <typename Prepare, typename Launch>
void resolveOperator(OperatorLibraries &libraries, const char *name, Prepare *&prepare, Launch *&launch) {
    prepare = reinterpret_cast<Prepare *>(libraries.find((std::string(name) + "GetWorkspaceSize").c_str()));
    launch = reinterpret_cast<Launch *>(libraries.find(name));
    if (prepare == nullptr || launch == nullptr) {
        prepare = nullptr;
        launch = nullptr;
    }
}

infiniStatus_t load(Api *api) {
    // RTLD_GLOBAL: the operator libraries need these two's symbols, found by soname once they are loaded.
    void *acl = openFirst(candidatePaths("libascendcl.so"), RTLD_NOW | RTLD_GLOBAL);
    if (acl == nullptr) return INFINI_STATUS_DEVICE_NOT_FOUND;
    void *nnopbase = openFirst(candidatePaths("libnnopbase.so"), RTLD_NOW | RTLD_GLOBAL);
    if (nnopbase == nullptr) return INFINI_STATUS_DEVICE_NOT_FOUND;

#define RESOLVE(library, name) ok = resolve(library, #name, api->name) && ok
    bool ok = true;
    RESOLVE(acl, aclInit);
    RESOLVE(acl, aclrtGetDeviceCount);
    RESOLVE(acl, aclrtSetDevice);
    RESOLVE(acl, aclrtGetDevice);
    RESOLVE(acl, aclrtSynchronizeDevice);
    RESOLVE(acl, aclrtCreateStream);
    RESOLVE(acl, aclrtDestroyStream);
    RESOLVE(acl, aclrtSynchronizeStream);
    RESOLVE(acl, aclrtCreateEvent);
    RESOLVE(acl, aclrtDestroyEvent);
    RESOLVE(acl, aclrtRecordEvent);
    RESOLVE(acl, aclrtSynchronizeEvent);
    RESOLVE(acl, aclrtQueryEventStatus);
    RESOLVE(acl, aclrtStreamWaitEvent);
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
#undef RESOLVE
    if (!ok) return INFINI_STATUS_DEVICE_NOT_FOUND;
    resolve(acl, "aclrtGetSocName", api->aclrtGetSocName); // optional: only BatchNorm's saved invstd needs it

    // infiniop_py/_ascend.py lists the same operators, to name those missing.
    OperatorLibraries operators;
#define OPERATOR(name) resolveOperator(operators, #name, api->name##GetWorkspaceSize, api->name)
    OPERATOR(aclnnRmsNorm);
    OPERATOR(aclnnRmsNormGrad);
    OPERATOR(aclnnLayerNorm);
    OPERATOR(aclnnLayerNormBackward);
    OPERATOR(aclnnBatchNorm);
    OPERATOR(aclnnBatchNormBackward);
    OPERATOR(aclnnCast);
    OPERATOR(aclnnAdds);
    OPERATOR(aclnnRsqrt);
    OPERATOR(aclnnDiv);
#undef OPERATOR

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
    case 107002: return INFINI_STATUS_DEVICE_NOT_INITIALIZED; // ACL_ERROR_RT_CONTEXT_NULL: no device on this thread
    case 161001: return INFINI_STATUS_NULL_POINTER;           // ACLNN_ERR_PARAM_NULLPTR
    case 161002: return INFINI_STATUS_BAD_PARAM;              // ACLNN_ERR_PARAM_INVALID
    case 561001:                                              // ACLNN_ERR_INNER_INFERSHAPE_ERROR
    case 561002: return INFINI_STATUS_BAD_TENSOR_SHAPE;       // ACLNN_ERR_INNER_TILING_ERROR: shapes refused
    default: break;
    }
    // Parameter errors are ours to fix; resource, runtime and internal errors are not.
    return code >= 100000 && code < 200000 ? INFINI_STATUS_BAD_PARAM : INFINI_STATUS_INTERNAL_ERROR;
}

} // namespace ascend
