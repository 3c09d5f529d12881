"""Why the Ascend backend has no device, or refuses an operator: which CANN library or aclnn operator could not be
found, and where it was looked for.

libinfinirt / libinfiniop load CANN with dlopen at run time and only say DEVICE_NOT_FOUND (no runtime) or
NOT_IMPLEMENTED (an aclnn operator this install lacks); this module repeats the same search with ctypes so an
error message can name what is missing and the paths tried. The search order matches
native/src/devices/ascend/loader.cc.
"""

import ctypes
import os

LIBRARIES = ("libascendcl.so", "libnnopbase.so")  # the runtime: without either, no device
# After current CANN's libopapi_*.so (found by listing the directories), in torch_npu's order.
OLDER_OPERATOR_LIBRARIES = ("libopapi.so", "libaclnn_ops_train.so", "libaclnn_math.so")
# The aclnn operators the backend resolves (loader.cc's OPERATOR list), each with its ...GetWorkspaceSize phase.
OPERATORS = ("aclnnRmsNorm", "aclnnRmsNormGrad", "aclnnLayerNorm", "aclnnLayerNormBackward", "aclnnBatchNorm",
             "aclnnBatchNormBackward", "aclnnCast", "aclnnAdds", "aclnnRsqrt", "aclnnDiv")


def search_directories():
    """The directories of a CANN install the native loader looks in, in order."""
    directories = []
    for variable, subdirs in (
        ("ASCEND_TOOLKIT_HOME", ("lib64", "lib")),
        ("ASCEND_HOME_PATH", ("lib64", "lib")),
        ("ASCEND_HOME", ("lib64", "lib", "ascend-toolkit/latest/lib64")),
    ):
        root = os.environ.get(variable)
        if root:
            directories.extend(os.path.join(root, subdir) for subdir in subdirs)
    return directories


def candidate_paths(library):
    """Where the native loader looks for `library`, in order (the last entry is the bare name)."""
    return [os.path.join(directory, library) for directory in search_directories()] + [library]


def split_operator_libraries():
    """Paths of current CANN's libopapi_*.so: listed in the search directories then LD_LIBRARY_PATH's, in name
    order, the first directory holding a name winning."""
    directories = search_directories() + [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    found = {}
    for directory in directories:
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        for name in names:
            if name.startswith("libopapi_") and name.endswith(".so") and len(name) > 12:
                found.setdefault(name, os.path.join(directory, name))
    return [found[name] for name in sorted(found)]


def _load(paths, mode):
    """(path loaded or None, [(path, why it failed), ...]) for the first of `paths` that loads."""
    failures = []
    for path in paths:
        if os.sep in path and not os.path.exists(path):
            failures.append((path, "no such file"))
            continue
        try:
            return ctypes.CDLL(path, mode=mode), path, failures
        except OSError as error:
            failures.append((path, str(error)))
    return None, None, failures


def probe():
    """[(library, loaded_from or None, [(path, why it failed), ...])] of the runtime libraries, in loading order.

    They are loaded RTLD_GLOBAL, as the native loader does: the operator libraries need their symbols.
    """
    report = []
    for library in LIBRARIES:
        _, found, failures = _load(candidate_paths(library), ctypes.RTLD_GLOBAL)
        report.append((library, found, failures))
    return report


def missing_cann_reason():
    """A sentence naming the first CANN library that cannot be loaded and every path tried, or None."""
    for library, found, failures in probe():
        if found is None:
            tried = "; ".join(f"{path}: {why}" for path, why in failures)
            return (
                f"the Ascend backend needs CANN: {library} could not be loaded "
                f"(set ASCEND_TOOLKIT_HOME, e.g. by sourcing CANN's set_env.sh). Tried: {tried}"
            )
    return None


def missing_operators_reason():
    """A sentence naming the aclnn operators no operator library has and the libraries searched, or None (none
    missing, or no CANN runtime at all: missing_cann_reason says why)."""
    if missing_cann_reason() is not None:
        return None
    candidates = [[path] for path in split_operator_libraries()]
    candidates += [candidate_paths(library) for library in OLDER_OPERATOR_LIBRARIES]
    opened = []  # per candidate opened so far: (library or None, what to say of it)

    def has(symbol):
        for index, paths in enumerate(candidates):
            if index == len(opened):
                library, path, failures = _load(paths, os.RTLD_LAZY | os.RTLD_LOCAL)
                tried = "; ".join(f"{p}: {why}" for p, why in failures)
                opened.append((library, path if library is not None else f"{os.path.basename(paths[0])} "
                                                                        f"(not loaded: {tried})"))
            library = opened[index][0]
            if library is not None and hasattr(library, symbol):
                return True
        return False

    missing = [name for name in OPERATORS if not (has(name + "GetWorkspaceSize") and has(name))]
    if not missing:
        return None
    return (f"this CANN install lacks {', '.join(missing)}, which the Ascend backend needs for some operators; "
            f"searched, in order: {'; '.join(said for _, said in opened)}")
