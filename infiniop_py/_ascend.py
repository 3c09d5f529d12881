"""Why the Ascend backend has no device: which CANN library could not be loaded, and from where.

libinfinirt loads CANN with dlopen at run time and only says DEVICE_NOT_FOUND when that fails; this module
repeats the same search with ctypes so an error message can name the missing library and the paths tried.
The search order matches native/src/devices/ascend/loader.cc.
"""

import ctypes
import os

LIBRARIES = ("libascendcl.so", "libnnopbase.so", "libopapi.so")


def candidate_paths(library):
    """Where the native loader looks for `library`, in order (the last entry is the bare name)."""
    paths = []
    for variable, subdirs in (
        ("ASCEND_TOOLKIT_HOME", ("lib64", "lib")),
        ("ASCEND_HOME", ("lib64", "lib", "ascend-toolkit/latest/lib64")),
    ):
        root = os.environ.get(variable)
        if root:
            paths.extend(os.path.join(root, subdir, library) for subdir in subdirs)
    paths.append(library)  # the dynamic loader's own search path
    return paths


def probe():
    """[(library, loaded_from or None, [(path, why it failed), ...])] in loading order.

    Libraries are loaded RTLD_GLOBAL in order, as the native loader does: libopapi needs libnnopbase.
    """
    report = []
    for library in LIBRARIES:
        failures = []
        found = None
        for path in candidate_paths(library):
            if os.sep in path and not os.path.exists(path):
                failures.append((path, "no such file"))
                continue
            try:
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            except OSError as error:
                failures.append((path, str(error)))
                continue
            found = path
            break
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
