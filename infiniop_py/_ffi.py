"""The cdef of the public C headers, and finding and loading the native libraries.

Loading is lazy: ``import infiniop_py`` works without the libraries; the first call that
needs them loads libinfinirt (RTLD_GLOBAL, so libinfiniop's dependency on it resolves)
and then libinfiniop from the first place of the search order that has both.
"""

import ctypes
import ctypes.util
import os
import sys
import threading

import cffi

# A faithful copy of native/include (infinicore.h, infinirt.h, infiniop/*.h, infiniop/ops/*.h)
# without the __C / __export markers: a test parses the headers and compares.
CDEF = """
typedef enum {
    INFINI_STATUS_SUCCESS = 0,
    INFINI_STATUS_INTERNAL_ERROR = 1,
    INFINI_STATUS_NOT_IMPLEMENTED = 2,
    INFINI_STATUS_BAD_PARAM = 3,
    INFINI_STATUS_NULL_POINTER = 4,
    INFINI_STATUS_DEVICE_TYPE_NOT_SUPPORTED = 5,
    INFINI_STATUS_DEVICE_NOT_FOUND = 6,
    INFINI_STATUS_DEVICE_NOT_INITIALIZED = 7,
    INFINI_STATUS_DEVICE_ARCHITECTURE_NOT_SUPPORTED = 8,
    INFINI_STATUS_BAD_TENSOR_DTYPE = 10,
    INFINI_STATUS_BAD_TENSOR_SHAPE = 11,
    INFINI_STATUS_BAD_TENSOR_STRIDES = 12,
    INFINI_STATUS_INSUFFICIENT_WORKSPACE = 13,
} infiniStatus_t;

typedef enum {
    INFINI_DEVICE_CPU = 0,
    INFINI_DEVICE_NVIDIA = 1,
    INFINI_DEVICE_CAMBRICON = 2,
    INFINI_DEVICE_ASCEND = 3,
    INFINI_DEVICE_METAX = 4,
    INFINI_DEVICE_MOORE = 5,
    INFINI_DEVICE_ILUVATAR = 6,
    INFINI_DEVICE_KUNLUN = 7,
    INFINI_DEVICE_HYGON = 8,
    INFINI_DEVICE_QY = 9,
    INFINI_DEVICE_ALI = 10,
    INFINI_DEVICE_TYPE_COUNT
} infiniDevice_t;

typedef enum {
    INFINI_DTYPE_INVALID = 0,
    INFINI_DTYPE_BYTE = 1,
    INFINI_DTYPE_BOOL = 2,
    INFINI_DTYPE_I8 = 3,
    INFINI_DTYPE_I16 = 4,
    INFINI_DTYPE_I32 = 5,
    INFINI_DTYPE_I64 = 6,
    INFINI_DTYPE_U8 = 7,
    INFINI_DTYPE_U16 = 8,
    INFINI_DTYPE_U32 = 9,
    INFINI_DTYPE_U64 = 10,
    INFINI_DTYPE_F8 = 11,
    INFINI_DTYPE_F16 = 12,
    INFINI_DTYPE_F32 = 13,
    INFINI_DTYPE_F64 = 14,
    INFINI_DTYPE_C16 = 15,
    INFINI_DTYPE_C32 = 16,
    INFINI_DTYPE_C64 = 17,
    INFINI_DTYPE_C128 = 18,
    INFINI_DTYPE_BF16 = 19,
} infiniDtype_t;

/* infinirt.h */
typedef void *infinirtStream_t;
typedef void *infinirtEvent_t;

typedef enum {
    INFINIRT_EVENT_COMPLETE = 0,
    INFINIRT_EVENT_NOT_READY = 1,
} infinirtEventStatus_t;

typedef enum {
    INFINIRT_MEMCPY_H2H = 0,
    INFINIRT_MEMCPY_H2D = 1,
    INFINIRT_MEMCPY_D2H = 2,
    INFINIRT_MEMCPY_D2D = 3,
} infinirtMemcpyKind_t;

infiniStatus_t infinirtInit(void);
infiniStatus_t infinirtGetDeviceCount(infiniDevice_t device, int *count);
infiniStatus_t infinirtSetDevice(infiniDevice_t device, int device_id);
infiniStatus_t infinirtGetDevice(infiniDevice_t *device_ptr, int *device_id_ptr);
infiniStatus_t infinirtDeviceSynchronize(void);

infiniStatus_t infinirtStreamCreate(infinirtStream_t *stream_ptr);
infiniStatus_t infinirtStreamDestroy(infinirtStream_t stream);
infiniStatus_t infinirtStreamSynchronize(infinirtStream_t stream);
infiniStatus_t infinirtStreamWaitEvent(infinirtStream_t stream, infinirtEvent_t event);

infiniStatus_t infinirtEventCreate(infinirtEvent_t *event_ptr);
infiniStatus_t infinirtEventRecord(infinirtEvent_t event, infinirtStream_t stream);
infiniStatus_t infinirtEventQuery(infinirtEvent_t event, infinirtEventStatus_t *status_ptr);
infiniStatus_t infinirtEventSynchronize(infinirtEvent_t event);
infiniStatus_t infinirtEventDestroy(infinirtEvent_t event);

infiniStatus_t infinirtMalloc(void **p_ptr, size_t size);
infiniStatus_t infinirtMallocHost(void **p_ptr, size_t size);
infiniStatus_t infinirtFree(void *ptr);
infiniStatus_t infinirtFreeHost(void *ptr);

infiniStatus_t infinirtMemcpy(void *dst, const void *src, size_t size, infinirtMemcpyKind_t kind);
infiniStatus_t infinirtMemcpyAsync(void *dst, const void *src, size_t size, infinirtMemcpyKind_t kind,
                                   infinirtStream_t stream);
infiniStatus_t infinirtMemset(void *ptr, int value, size_t size);

/* infiniop/handle.h */
typedef struct InfiniopHandle *infiniopHandle_t;

infiniStatus_t infiniopCreateHandle(infiniopHandle_t *handle_ptr);
infiniStatus_t infiniopDestroyHandle(infiniopHandle_t handle);

/* infiniop/cpu_isa.h */
infiniStatus_t infiniopGetCpuIsaEx(const char **name);

/* infiniop/tensor_descriptor.h */
typedef struct InfiniopTensorDescriptor *infiniopTensorDescriptor_t;

infiniStatus_t infiniopCreateTensorDescriptor(infiniopTensorDescriptor_t *desc_ptr, size_t ndim,
                                              const size_t *shape, const ptrdiff_t *strides,
                                              infiniDtype_t dtype);
infiniStatus_t infiniopDestroyTensorDescriptor(infiniopTensorDescriptor_t desc);

/* infiniop/operator_descriptor.h */
typedef struct InfiniopDescriptor *infiniopDescriptor_t;

infiniStatus_t infiniopGetDescriptorDeviceType(infiniopDescriptor_t desc, infiniDevice_t *device_type);
infiniStatus_t infiniopGetDescriptorDeviceId(infiniopDescriptor_t desc, int *device_id);

/* infiniop/ops/batch_norm.h */
typedef struct InfiniopDescriptor *infiniopBatchNormDescriptor_t;

infiniStatus_t infiniopCreateBatchNormDescriptor(infiniopHandle_t handle, infiniopBatchNormDescriptor_t *desc_ptr,
                                                 infiniopTensorDescriptor_t output_desc,
                                                 infiniopTensorDescriptor_t running_mean_desc,
                                                 infiniopTensorDescriptor_t running_var_desc,
                                                 infiniopTensorDescriptor_t input_desc,
                                                 infiniopTensorDescriptor_t weight_desc,
                                                 infiniopTensorDescriptor_t bias_desc, float momentum, float eps);
infiniStatus_t infiniopGetBatchNormWorkspaceSize(infiniopBatchNormDescriptor_t desc, size_t *size);
infiniStatus_t infiniopBatchNorm(infiniopBatchNormDescriptor_t desc, void *workspace, size_t workspace_size,
                                 void *output, void *running_mean, void *running_var, const void *input,
                                 const void *weight, const void *bias, void *stream);
infiniStatus_t infiniopCreateBatchNormDescriptorEx(
    infiniopHandle_t handle, infiniopBatchNormDescriptor_t *desc_ptr, infiniopTensorDescriptor_t y_desc,
    infiniopTensorDescriptor_t save_mean_desc, infiniopTensorDescriptor_t save_invstd_desc,
    infiniopTensorDescriptor_t running_mean_desc, infiniopTensorDescriptor_t running_var_desc,
    infiniopTensorDescriptor_t x_desc, infiniopTensorDescriptor_t weight_desc, infiniopTensorDescriptor_t bias_desc,
    int training, double momentum, double eps);
infiniStatus_t infiniopBatchNormEx(infiniopBatchNormDescriptor_t desc, void *workspace, size_t workspace_size,
                                   void *y, void *save_mean, void *save_invstd, void *running_mean,
                                   void *running_var, const void *x, const void *weight, const void *bias,
                                   void *stream);
infiniStatus_t infiniopDestroyBatchNormDescriptor(infiniopBatchNormDescriptor_t desc);

/* infiniop/ops/rms_norm.h */
typedef struct InfiniopDescriptor *infiniopRMSNormDescriptor_t;

infiniStatus_t infiniopCreateRMSNormDescriptor(infiniopHandle_t handle, infiniopRMSNormDescriptor_t *desc_ptr,
                                               infiniopTensorDescriptor_t y_desc, infiniopTensorDescriptor_t x_desc,
                                               infiniopTensorDescriptor_t w_desc, float epsilon);
infiniStatus_t infiniopGetRMSNormWorkspaceSize(infiniopRMSNormDescriptor_t desc, size_t *size);
infiniStatus_t infiniopRMSNorm(infiniopRMSNormDescriptor_t desc, void *workspace, size_t workspace_size, void *y,
                               const void *x, const void *w, void *stream);
infiniStatus_t infiniopCreateRMSNormDescriptorEx(infiniopHandle_t handle, infiniopRMSNormDescriptor_t *desc_ptr,
                                                 infiniopTensorDescriptor_t y_desc,
                                                 infiniopTensorDescriptor_t rstd_desc,
                                                 infiniopTensorDescriptor_t x_desc,
                                                 infiniopTensorDescriptor_t w_desc, double epsilon);
infiniStatus_t infiniopRMSNormEx(infiniopRMSNormDescriptor_t desc, void *workspace, size_t workspace_size, void *y,
                                 void *rstd, const void *x, const void *w, void *stream);
infiniStatus_t infiniopDestroyRMSNormDescriptor(infiniopRMSNormDescriptor_t desc);

/* infiniop/ops/layer_norm.h */
typedef struct InfiniopDescriptor *infiniopLayerNormDescriptor_t;

infiniStatus_t infiniopCreateLayerNormDescriptor(infiniopHandle_t handle, infiniopLayerNormDescriptor_t *desc_ptr,
                                                 infiniopTensorDescriptor_t output_desc,
                                                 infiniopTensorDescriptor_t input_standardization_desc,
                                                 infiniopTensorDescriptor_t input_std_deviation_desc,
                                                 infiniopTensorDescriptor_t input_desc,
                                                 infiniopTensorDescriptor_t weight_desc,
                                                 infiniopTensorDescriptor_t bias_desc, float eps);
infiniStatus_t infiniopGetLayerNormWorkspaceSize(infiniopLayerNormDescriptor_t desc, size_t *size);
infiniStatus_t infiniopLayerNorm(infiniopLayerNormDescriptor_t desc, void *workspace, size_t workspace_size,
                                 void *output, void *input_standardization, void *input_std_deviation,
                                 const void *input, const void *weight, const void *bias, void *stream);
infiniStatus_t infiniopCreateLayerNormDescriptorEx(infiniopHandle_t handle, infiniopLayerNormDescriptor_t *desc_ptr,
                                                   infiniopTensorDescriptor_t y_desc,
                                                   infiniopTensorDescriptor_t mean_desc,
                                                   infiniopTensorDescriptor_t rstd_desc,
                                                   infiniopTensorDescriptor_t x_desc,
                                                   infiniopTensorDescriptor_t w_desc,
                                                   infiniopTensorDescriptor_t b_desc, double eps);
infiniStatus_t infiniopLayerNormEx(infiniopLayerNormDescriptor_t desc, void *workspace, size_t workspace_size,
                                   void *y, void *mean, void *rstd, const void *x, const void *w, const void *b,
                                   void *stream);
infiniStatus_t infiniopDestroyLayerNormDescriptor(infiniopLayerNormDescriptor_t desc);

/* infiniop/ops/rms_norm_backward.h */
typedef struct InfiniopDescriptor *infiniopRMSNormBackwardDescriptor_t;

infiniStatus_t infiniopCreateRMSNormBackwardDescriptor(
    infiniopHandle_t handle, infiniopRMSNormBackwardDescriptor_t *desc_ptr, infiniopTensorDescriptor_t grad_x_desc,
    infiniopTensorDescriptor_t grad_w_desc, infiniopTensorDescriptor_t grad_y_desc, infiniopTensorDescriptor_t x_desc,
    infiniopTensorDescriptor_t w_desc);
infiniStatus_t infiniopGetRMSNormBackwardWorkspaceSize(infiniopRMSNormBackwardDescriptor_t desc, size_t *size);
infiniStatus_t infiniopRMSNormBackward(infiniopRMSNormBackwardDescriptor_t desc, void *workspace,
                                       size_t workspace_size, void *grad_x, void *grad_w,
                                       const void *grad_y, const void *x, const void *w, void *stream);
infiniStatus_t infiniopCreateRMSNormBackwardDescriptorEx(
    infiniopHandle_t handle, infiniopRMSNormBackwardDescriptor_t *desc_ptr, infiniopTensorDescriptor_t grad_x_desc,
    infiniopTensorDescriptor_t grad_w_desc, infiniopTensorDescriptor_t grad_y_desc, infiniopTensorDescriptor_t x_desc,
    infiniopTensorDescriptor_t w_desc, infiniopTensorDescriptor_t rstd_desc, double epsilon);
infiniStatus_t infiniopRMSNormBackwardEx(infiniopRMSNormBackwardDescriptor_t desc, void *workspace,
                                         size_t workspace_size, void *grad_x, void *grad_w, const void *grad_y,
                                         const void *x, const void *w, const void *rstd, void *stream);
infiniStatus_t infiniopDestroyRMSNormBackwardDescriptor(infiniopRMSNormBackwardDescriptor_t desc);

/* infiniop/ops/layer_norm_backward.h */
typedef struct InfiniopDescriptor *infiniopLayerNormBackwardDescriptor_t;

infiniStatus_t infiniopCreateLayerNormBackwardDescriptor(
    infiniopHandle_t handle, infiniopLayerNormBackwardDescriptor_t *desc_ptr,
    infiniopTensorDescriptor_t grad_input_desc, infiniopTensorDescriptor_t grad_weight_desc,
    infiniopTensorDescriptor_t grad_bias_desc, infiniopTensorDescriptor_t grad_output_desc,
    infiniopTensorDescriptor_t weight_desc, infiniopTensorDescriptor_t input_standardization_desc,
    infiniopTensorDescriptor_t input_std_deviation_desc);
infiniStatus_t infiniopGetLayerNormBackwardWorkspaceSize(infiniopLayerNormBackwardDescriptor_t desc, size_t *size);
infiniStatus_t infiniopLayerNormBackward(infiniopLayerNormBackwardDescriptor_t desc, void *workspace,
                                         size_t workspace_size, void *grad_input, void *grad_weight,
                                         void *grad_bias, const void *grad_output, const void *weight,
                                         const void *input_standardization,
                                         const void *input_std_deviation, void *stream);
infiniStatus_t infiniopCreateLayerNormBackwardDescriptorEx(
    infiniopHandle_t handle, infiniopLayerNormBackwardDescriptor_t *desc_ptr,
    infiniopTensorDescriptor_t grad_input_desc, infiniopTensorDescriptor_t grad_weight_desc,
    infiniopTensorDescriptor_t grad_bias_desc, infiniopTensorDescriptor_t grad_output_desc,
    infiniopTensorDescriptor_t weight_desc, infiniopTensorDescriptor_t input_standardization_desc,
    infiniopTensorDescriptor_t input_std_deviation_desc);
infiniStatus_t infiniopCreateLayerNormBackwardFromInputDescriptorEx(
    infiniopHandle_t handle, infiniopLayerNormBackwardDescriptor_t *desc_ptr,
    infiniopTensorDescriptor_t grad_input_desc, infiniopTensorDescriptor_t grad_weight_desc,
    infiniopTensorDescriptor_t grad_bias_desc, infiniopTensorDescriptor_t grad_output_desc,
    infiniopTensorDescriptor_t weight_desc, infiniopTensorDescriptor_t input_desc,
    infiniopTensorDescriptor_t mean_desc, infiniopTensorDescriptor_t rstd_desc);
infiniStatus_t infiniopLayerNormBackwardFromInputEx(infiniopLayerNormBackwardDescriptor_t desc, void *workspace,
                                                    size_t workspace_size, void *grad_input, void *grad_weight,
                                                    void *grad_bias, const void *grad_output, const void *weight,
                                                    const void *input, const void *mean, const void *rstd,
                                                    void *stream);
infiniStatus_t infiniopDestroyLayerNormBackwardDescriptor(infiniopLayerNormBackwardDescriptor_t desc);

/* infiniop/ops/batch_norm_backward.h */
typedef struct InfiniopDescriptor *infiniopBatchNormBackwardDescriptor_t;

infiniStatus_t infiniopCreateBatchNormBackwardDescriptor(
    infiniopHandle_t handle, infiniopBatchNormBackwardDescriptor_t *desc_ptr,
    infiniopTensorDescriptor_t grad_input_desc, infiniopTensorDescriptor_t grad_weight_desc,
    infiniopTensorDescriptor_t grad_bias_desc, infiniopTensorDescriptor_t input_desc,
    infiniopTensorDescriptor_t grad_output_desc, infiniopTensorDescriptor_t weight_desc,
    infiniopTensorDescriptor_t running_mean_desc, infiniopTensorDescriptor_t running_var_desc);
infiniStatus_t infiniopGetBatchNormBackwardWorkspaceSize(infiniopBatchNormBackwardDescriptor_t desc, size_t *size);
infiniStatus_t infiniopBatchNormBackward(infiniopBatchNormBackwardDescriptor_t desc, void *workspace,
                                         size_t workspace_size, void *grad_input, void *grad_weight,
                                         void *grad_bias, const void *input, const void *grad_output,
                                         const void *weight, const void *running_mean,
                                         const void *running_var, void *stream);
infiniStatus_t infiniopCreateBatchNormBackwardDescriptorEx(
    infiniopHandle_t handle, infiniopBatchNormBackwardDescriptor_t *desc_ptr,
    infiniopTensorDescriptor_t grad_input_desc, infiniopTensorDescriptor_t grad_weight_desc,
    infiniopTensorDescriptor_t grad_bias_desc, infiniopTensorDescriptor_t input_desc,
    infiniopTensorDescriptor_t grad_output_desc, infiniopTensorDescriptor_t weight_desc,
    infiniopTensorDescriptor_t running_mean_desc, infiniopTensorDescriptor_t running_var_desc,
    infiniopTensorDescriptor_t save_mean_desc, infiniopTensorDescriptor_t save_invstd_desc, double epsilon,
    int training);
infiniStatus_t infiniopBatchNormBackwardEx(infiniopBatchNormBackwardDescriptor_t desc, void *workspace,
                                           size_t workspace_size, void *grad_input, void *grad_weight,
                                           void *grad_bias, const void *input, const void *grad_output,
                                           const void *weight, const void *running_mean,
                                           const void *running_var, const void *save_mean,
                                           const void *save_invstd, void *stream);
infiniStatus_t infiniopBatchNormBackwardReduceEx(infiniopBatchNormBackwardDescriptor_t desc, void *workspace,
                                                 size_t workspace_size, void *sum_grad_output,
                                                 void *sum_grad_centered, void *grad_weight, void *grad_bias,
                                                 const void *input, const void *grad_output,
                                                 const void *running_mean, const void *running_var,
                                                 const void *save_mean, const void *save_invstd, void *stream);
infiniStatus_t infiniopBatchNormBackwardElementwiseEx(
    infiniopBatchNormBackwardDescriptor_t desc, void *workspace, size_t workspace_size, void *grad_input,
    const void *input, const void *grad_output, const void *weight, const void *running_mean,
    const void *running_var, const void *save_mean, const void *save_invstd, const void *sum_grad_output,
    const void *sum_grad_centered, int64_t total_count, void *stream);
infiniStatus_t infiniopDestroyBatchNormBackwardDescriptor(infiniopBatchNormBackwardDescriptor_t desc);
"""

ffi = cffi.FFI()
ffi.cdef(CDEF)

LIBRARY_DIR_ENV = "INFINIOP_PY_LIBRARY_DIR"
INFINI_ROOT_ENV = "INFINI_ROOT"
BUNDLED_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib")


class LibraryNotFoundError(OSError):
    """No place of the search order had loadable libinfiniop and libinfinirt."""


class NativeLibraries:
    """The loaded pair: ``rt`` (libinfinirt) and ``op`` (libinfiniop), and where op came from."""

    def __init__(self, rt, op, op_path):
        self.rt = rt
        self.op = op
        self.op_path = op_path


def shared_library_name(stem):
    if sys.platform == "win32":
        return stem + ".dll"
    if sys.platform == "darwin":
        return "lib" + stem + ".dylib"
    return "lib" + stem + ".so"


def _directory_candidates():
    """(description, directory or None, why it was skipped) in search order."""
    library_dir = os.environ.get(LIBRARY_DIR_ENV)
    yield ("$" + LIBRARY_DIR_ENV, library_dir, None if library_dir else "not set")
    infini_root = os.environ.get(INFINI_ROOT_ENV)
    root_lib = os.path.join(infini_root, "lib") if infini_root else None
    yield ("$" + INFINI_ROOT_ENV + "/lib", root_lib, None if infini_root else "not set")
    yield ("bundled", BUNDLED_DIR, None)


# RTLD_NODELETE: the libraries stay mapped when cffi closes them at interpreter exit; unloading
# them (and the OpenMP runtime they pull in) under OpenMP's idle worker threads crashes the process.
_DLOPEN_FLAGS = ffi.RTLD_NOW | getattr(ffi, "RTLD_NODELETE", 0)


def _open_pair(rt_path, op_path):
    """dlopen both, rt first and global; on failure close what was opened and re-raise."""
    rt = ffi.dlopen(rt_path, _DLOPEN_FLAGS | ffi.RTLD_GLOBAL)
    try:
        op = ffi.dlopen(op_path, _DLOPEN_FLAGS)
    except OSError:
        ffi.dlclose(rt)
        raise
    return rt, op


def _loaded_file_of(lib, symbol):
    """The absolute path of the file that defines ``symbol`` in ``lib`` (via dladdr)."""

    class DlInfo(ctypes.Structure):
        _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                    ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]

    dladdr = ctypes.CDLL(None).dladdr
    dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(DlInfo)]
    info = DlInfo()
    address = int(ffi.cast("uintptr_t", ffi.addressof(lib, symbol)))
    if not dladdr(address, ctypes.byref(info)) or not info.dli_fname:
        return None
    return os.path.abspath(os.fsdecode(info.dli_fname))


def _load_from_system():
    # find_library may miss a library without SONAME; the bare file name still lets the
    # dynamic loader search LD_LIBRARY_PATH, its cache and the default directories.
    rt_name = ctypes.util.find_library("infinirt") or shared_library_name("infinirt")
    op_name = ctypes.util.find_library("infiniop") or shared_library_name("infiniop")
    rt, op = _open_pair(rt_name, op_name)
    return NativeLibraries(rt, op, _loaded_file_of(op, "infiniopCreateHandle") or op_name)


def find_and_load():
    """Load from the first place that works; raise LibraryNotFoundError listing every try."""
    tried = []
    for description, directory, skipped in _directory_candidates():
        if skipped:
            tried.append(f"{description}: {skipped}")
            continue
        rt_path = os.path.abspath(os.path.join(directory, shared_library_name("infinirt")))
        op_path = os.path.abspath(os.path.join(directory, shared_library_name("infiniop")))
        missing = [p for p in (rt_path, op_path) if not os.path.isfile(p)]
        if missing:
            tried.append(f"{description} ({directory}): no file {', '.join(missing)}")
            continue
        try:
            rt, op = _open_pair(rt_path, op_path)
        except OSError as error:
            tried.append(f"{description} ({directory}): {error}")
            continue
        return NativeLibraries(rt, op, op_path)
    try:
        return _load_from_system()
    except OSError as error:
        tried.append(f"system loader: {error}")
    raise LibraryNotFoundError(
        _shadowing_hint() + "cannot load libinfiniop and libinfinirt; tried, in order:\n  " + "\n  ".join(tried)
    )


def _shadowing_hint():
    """Where this package is an unbuilt source tree (a clone's root after `pip install .`) and an installed
    infiniop-py has its libraries: what shadows what, and what to do; else ''."""
    if os.path.isdir(BUNDLED_DIR):
        return ""
    this_package = os.path.dirname(os.path.abspath(__file__))
    try:
        from importlib import metadata
        # Every infiniop-py on the path: the source tree's own egg-info (left by the build) comes first there.
        files = [entry for distribution in metadata.distributions()
                 if (distribution.metadata["Name"] or "").lower().replace("_", "-") == "infiniop-py"
                 for entry in distribution.files or []]
    except Exception:  # unreadable metadata
        return ""
    for entry in files:
        path = os.path.abspath(str(entry.locate()))
        installed = os.path.dirname(os.path.dirname(path))
        if (os.path.basename(path) == shared_library_name("infiniop") and os.path.isfile(path)
                and installed != this_package):
            return (f"infiniop_py was imported from the source tree {this_package}, which has no built libraries, "
                    f"and it shadows the installed package in {installed}: run Python from another directory "
                    f"(the current one comes first on sys.path), or build in place with `pip install -e .`.\n")
    return ""


_loaded = None
_load_lock = threading.Lock()


def libraries():
    """The loaded NativeLibraries, loading them on first use (a failure is retried next time)."""
    global _loaded
    if _loaded is None:
        with _load_lock:
            if _loaded is None:
                _loaded = find_and_load()
    return _loaded


def library_path():
    """Absolute path of the loaded libinfiniop (loads the libraries if needed)."""
    return libraries().op_path


def by_address(function):
    """``function`` (one of the C API's, as cdata) typed to take each pointer argument after the descriptor and the
    workspace as a uintptr_t: the tensors' data and the stream, given as integer addresses. The platform ABIs that
    this package builds for (x86-64 System V and Windows, AArch64) pass a uintptr_t in the same place and width as a
    void *, so the C function receives the same bits. Torch tensors and streams give their addresses as integers,
    and ffi.cast to void * cost about 0.1 us each: a microsecond on a backward call of 8 tensors."""
    kind = ffi.typeof(function)
    parameters = [argument.cname for argument in kind.args[:2]]
    parameters += ["uintptr_t" if argument.kind == "pointer" else argument.cname for argument in kind.args[2:]]
    return ffi.cast(f"{kind.result.cname}(*)({', '.join(parameters)})", function)
