"""The eager path's autograd nodes in C++ (autograd_nodes.cpp, issue 52). For ordinary operands the forward runs
whole in C++ (``forward``: the kernel ops.py would choose, then the node); otherwise it runs in Python as before
(ops.FORWARDS: torch's argument checks, the choice of kernel) and a C++ node becomes its output's grad_fn. The
backward allocates the gradients and runs this library's kernel from a descriptor cached per layout, without
Python: no GIL, and on CUDA nothing in Python on autograd's device thread. A tiny module's forward + backward on
the CPU costs 0.4-1.2x torch's own this way, 1.4-1.7x with the forward in Python and 2x and more with Python
Functions (docs/performance.md).

The C++ source is compiled on first use (about 25 s), with the C++ compiler that installing this package from
source needs ($CXX, else c++), against the installed torch's headers, Python's (where found: the forwards are then
a Python module, the cheapest call) and this package's libraries, and cached in ~/.cache/infiniop-py
($XDG_CACHE_HOME) per source, torch and library (builds unused for a month are removed); loading it registers
torch.ops.infiniop_nodes. Where it cannot be built or loaded, ``status()`` says why and the
eager path keeps the Python Functions (ops.EAGER), which give the same gradients bit for bit. Cases the nodes do not
take (parameters of mixed dtypes, an RMSNorm without weight, BatchNorm parameters not of shape (C,)) take those
Functions too.
"""

import hashlib
import importlib.machinery
import importlib.util
import os
import sys
import sysconfig
import threading
import time
from pathlib import Path

import torch

from . import ops
from .. import _known_layouts
from .._compiled_helpers import cache_dir, compile_to

SOURCE = Path(__file__).with_name("autograd_nodes.cpp")

_HALF_DTYPES = (torch.float16, torch.bfloat16)
_KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

_lock = threading.Lock()
_state = None  # None: not tried yet; else (the node ops or None, why not)
_FORWARDS = {}  # name: the op of the forward whole in C++ (forward below)


def _build():
    """The path of the compiled library, compiling it where the cache has none; RuntimeError saying why not."""
    import infiniop_py
    from .._ffi import library_path

    library_dir = os.path.dirname(library_path())
    torch_dir = os.path.dirname(os.path.abspath(torch.__file__))
    includes = [os.path.join(torch_dir, "include"), os.path.join(torch_dir, "include", "torch", "csrc", "api", "include"),
                infiniop_py.include_dir()]
    python_include = sysconfig.get_paths()["include"]  # where Python.h is found, the forwards are a module too
    if os.path.isfile(os.path.join(python_include, "Python.h")):
        includes.append(python_include)
    compiler = os.environ.get("CXX", "c++")
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    # What the build depends on: a change to the C API's headers (the same paths) must not reuse an old build.
    headers = sorted(Path(infiniop_py.include_dir()).rglob("*.h"))
    identity = "\n".join([SOURCE.read_text(), *(header.read_text() for header in headers), torch.__version__,
                          torch_dir, library_dir, *includes, compiler, str(abi)])
    target = cache_dir() / f"autograd_nodes-{hashlib.sha256(identity.encode()).hexdigest()[:16]}.so"
    if target.is_file():
        os.utime(target)  # in use: kept by _prune
        return target
    if target.parent.is_dir():
        _prune(target.parent)
    command = [compiler, "-std=c++17", "-O2", "-shared", "-fPIC", f"-D_GLIBCXX_USE_CXX11_ABI={abi}", str(SOURCE),
               *(f"-I{include}" for include in includes), f"-L{torch_dir}/lib", "-ltorch", "-ltorch_cpu",
               "-ltorch_python", "-lc10",
               f"-L{library_dir}", "-linfiniop", "-linfinirt", f"-Wl,-rpath,{torch_dir}/lib",
               f"-Wl,-rpath,{library_dir}"]
    try:
        compile_to(target, command)
    except RuntimeError as why:
        raise RuntimeError(f"compiling {SOURCE.name} failed: {why}") from None
    return target


def _import(path):
    """Load the build (registering torch.ops.infiniop_nodes) as the Python module of its forwards; None where it was
    built without Python's headers, and is then loaded as torch loads libraries of ops."""
    spec = importlib.util.spec_from_file_location(
        "_infiniop_nodes", path, loader=importlib.machinery.ExtensionFileLoader("_infiniop_nodes", str(path)))
    try:
        module = importlib.util.module_from_spec(spec)  # loads it
        spec.loader.exec_module(module)
    except ImportError:  # no PyInit__infiniop_nodes in it
        torch.ops.load_library(str(path))
        return None
    return module


UNUSED_DAYS = 30


def _prune(directory):
    """Remove the builds no process has loaded for UNUSED_DAYS (each virtual environment, torch or library gets a
    build of its own, and CI makes a fresh environment per run) and partial ones a day old."""
    now = time.time()
    for path in directory.glob("autograd_nodes-*"):
        limit = 86400 if path.suffix == ".tmp" else UNUSED_DAYS * 86400
        try:
            if now - path.stat().st_mtime > limit:
                path.unlink()
        except OSError:  # another process's, gone or not ours to remove
            pass


def _load():
    global _state
    with _lock:
        if _state is None:
            if not sys.platform.startswith("linux"):
                _state = (None, "built on Linux only")
            else:
                try:
                    forwards = _import(_build())
                    nodes = torch.ops.infiniop_nodes
                    minimums = ops._LIBRARY_LAYER_NORM_MIN_ELEMENTS
                    nodes.configure([minimums[torch.float32], minimums[torch.bfloat16], minimums[torch.float16]])
                    for name in ("rms_norm", "layer_norm", "batch_norm"):
                        # Else the overload's builtin: OpOverload.__call__ only forwards to it (0.6 us a call).
                        overload = getattr(nodes, f"{name}_forward").default
                        _FORWARDS[name] = (getattr(forwards, name) if forwards is not None
                                           else getattr(overload, "_op", overload))
                    if forwards is not None:
                        _known_layouts.use_native_torch_calls(forwards.KnownTorchCalls)
                    _state = ((nodes.rms_norm.default, nodes.layer_norm.default, nodes.batch_norm.default), "")
                except (RuntimeError, OSError) as error:
                    _state = (None, str(error))
    return _state


def status():
    """(True, "") where the eager path runs the C++ nodes (building them now if they were not yet), else (False,
    why not)."""
    nodes, why = _load()
    return nodes is not None, why


def _served(input, parameter_dtype):
    """Whether the kernels take these operands as they are: data of a kernel dtype on the CPU or CUDA, and its
    parameters (None: there are none) of one dtype, the data's or F32 with F16/BF16 data (the Python Functions widen
    other mixtures first). Attribute reads and identity tests alone: this runs on every training call."""
    dtype = input.dtype
    return ((parameter_dtype is None or parameter_dtype is dtype
             or (parameter_dtype is torch.float32 and dtype in _HALF_DTYPES))
            and dtype in _KERNEL_DTYPES and (input.is_cpu or input.is_cuda))


def _common_dtype(*parameters):
    """The dtype the given parameters share; None without any; False where they differ."""
    dtype = None
    for parameter in parameters:
        if parameter is not None:
            if dtype is None:
                dtype = parameter.dtype
            elif parameter.dtype is not dtype:
                return False
    return dtype


def _forward_without_grad(name, args):
    """ops.FORWARDS[name] with grad mode off (the node records the step, not the forward's own ops)."""
    torch._C._set_grad_enabled(False)
    try:
        return ops.FORWARDS[name](*args)
    finally:
        torch._C._set_grad_enabled(True)


def rms_norm(input, normalized_shape, weight, eps):
    if weight is None or not _served(input, weight.dtype):
        return None
    output, rstd = _forward_without_grad("rms_norm", (input, normalized_shape, weight, eps))
    return _state[0][0](output, rstd, input, weight, None if eps is None else float(eps)), rstd


def layer_norm(input, normalized_shape, weight, bias, eps):
    dtype = _common_dtype(weight, bias)
    if dtype is False or not _served(input, dtype):
        return None
    output, mean, rstd = _forward_without_grad("layer_norm", (input, normalized_shape, weight, bias, eps))
    return _state[0][1](output, mean, rstd, input, weight, bias, len(normalized_shape)), mean, rstd


def batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    dtype = _common_dtype(weight, bias, running_mean, running_var)
    if (dtype is False or not _served(input, dtype) or not 2 <= input.dim() <= 5
            or any(t is not None and t.dim() != 1 for t in (weight, bias, running_mean, running_var))):
        return None
    args = (input, weight, bias, running_mean, running_var, training, momentum, eps)
    output, save_mean, save_invstd = _forward_without_grad("batch_norm", args)
    return (_state[0][2](output, save_mean, save_invstd, input, weight, bias, running_mean, running_var,
                         bool(training), float(eps)), save_mean, save_invstd)


_SERVED = {"rms_norm": rms_norm, "layer_norm": layer_norm, "batch_norm": batch_norm}


def forward(name, args):
    """The outputs of ops.FORWARDS[name](*args), the node the output's grad_fn where autograd records (as ``apply``
    gives them), all in C++: one op call where the Python forward takes ten frames. None where the nodes are
    unavailable or the C++ forward does not take these operands (they are not ordinary: see autograd_nodes.cpp), and
    the Python forward must run, with its checks and errors."""
    if (_state or _load())[0] is None:
        return None
    # A tensor subclass may override torch's functions (__torch_function__), which a call into C++ would bypass.
    if type(args[0]) is not torch.Tensor:
        return None
    if name == "batch_norm" and args[5] is not True and args[5] is not False:  # the binding takes a bool
        return None
    return _FORWARDS[name](*args) or None


def apply(name, args):
    """The outputs of ops.EAGER[name].apply(*args) (grad mode on, an operand requiring grad), through the C++ node;
    None where the nodes are unavailable or do not take these operands."""
    if (_state or _load())[0] is None:
        return None
    return _SERVED[name](*args)
