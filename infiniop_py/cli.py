"""The infiniop-py command: ``smoke`` checks every operator, backward and forward, in every dtype on random data
against the float64 reference (exit 0: all pass; 1: a failure; 2: no such device; a forward the device's backend
does not have is listed as such); ``bench`` times them (the bench sub-package)."""

import argparse
import functools
import os
import sys
import time

import ml_dtypes
import numpy as np

from . import cpu_isa, reference
from ._device_memory import DeviceArray
from ._ffi import LibraryNotFoundError, library_path, libraries
from .batch_norm import BatchNorm
from .batch_norm_backward import BatchNormBackward
from .errors import (DeviceArchitectureNotSupportedError, DeviceNotFoundError, DeviceNotInitializedError,
                     DeviceTypeNotSupportedError, InfiniopError, NotImplementedStatusError, check)
from .handle import Handle, resolve_alias, selected_device
from .layer_norm import LayerNorm
from .layer_norm_backward import LayerNormBackward
from .rms_norm import RMSNorm
from .rms_norm_backward import RMSNormBackward


def _forward_inputs(*names):
    return functools.partial(reference.make_forward_inputs, names=names)


# (name, operator class, input maker, float64 reference, shape of the main tensor, the outputs that are statistics
# (F32); the others take the data's dtype). Inputs and outputs are passed by the operator's argument names.
CASES = (
    ("rms_norm_backward", RMSNormBackward, reference.make_rms_norm_inputs, reference.rms_norm_backward,
     (4, 32, 256), ()),
    ("layer_norm_backward", LayerNormBackward, reference.make_layer_norm_inputs, reference.layer_norm_backward,
     (4, 32, 256), ()),
    ("batch_norm_backward", BatchNormBackward, reference.make_batch_norm_inputs, reference.batch_norm_backward,
     (8, 16, 64), ()),
    ("rms_norm", RMSNorm, _forward_inputs("w"), reference.rms_norm, (4, 32, 256), ("rstd",)),
    ("layer_norm", LayerNorm, _forward_inputs("w", "b"), reference.layer_norm, (4, 32, 256), ("mean", "rstd")),
    ("batch_norm", BatchNorm, _forward_inputs("weight", "bias", "running_mean", "running_var"), reference.batch_norm,
     (8, 16, 64), ("save_mean", "save_invstd")),
)

DTYPES = (np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))
BUILT_DEVICES = ("cpu", "nvidia", "ascend")  # the backends this project builds (handle.py knows more names)
DEVICE_UNAVAILABLE = (DeviceTypeNotSupportedError, DeviceNotFoundError, DeviceNotInitializedError,
                      DeviceArchitectureNotSupportedError)


def _run_case(handle, operator_class, inputs, expected, statistics):
    """Run once to warm up and once timed; return (max relative error over the outputs, seconds). Arrays go to the
    operator by its argument names: its outputs (the first len(expected) of operator_class._outputs) and inputs."""
    dtype = next(iter(inputs.values())).dtype
    names = operator_class._outputs[:len(expected)]
    outputs = [np.zeros(e.shape, dtype=np.float32 if name in statistics else dtype)
               for name, e in zip(names, expected)]
    arrays = outputs + list(inputs.values())
    if handle.device != "cpu":
        arrays = [DeviceArray.from_numpy(a, handle.device, handle.device_id) for a in arrays]
    named = dict(zip((*names, *inputs), arrays))
    with operator_class(handle, **named) as operator:
        operator(**named)
        start = time.perf_counter()
        operator(**named)
        if handle.device != "cpu":
            with selected_device(handle.device, handle.device_id):
                check(libraries().rt.infinirtDeviceSynchronize(), "infinirtDeviceSynchronize")
        seconds = time.perf_counter() - start
    if handle.device != "cpu":
        outputs = [a.to_numpy() for a in arrays[:len(outputs)]]
    error = max(reference.relative_error(actual, wanted) for actual, wanted in zip(outputs, expected))
    return error, seconds


def smoke(device, device_id, seed):
    try:
        handle = Handle(device, device_id)
    except DEVICE_UNAVAILABLE as error:
        print(f"infiniop-py smoke: device {device}:{device_id} is not available: {error}")
        return 2
    rng = np.random.default_rng(seed)
    isa = cpu_isa() if device == "cpu" else None
    kernels = f" (CPU kernels {isa})" if isa else ""
    print(f"infiniop-py smoke on {device}:{device_id}{kernels}, library {library_path()}")
    row = "{:<20} {:<9} {:<14} {:>13} {:>10}  {:<6} {:>10}"
    print(row.format("op", "dtype", "shape", "max rel error", "tolerance", "result", "time"))
    failures = 0
    with handle:
        for name, operator_class, make_inputs, reference_of, shape, statistics in CASES:
            for dtype in DTYPES:
                inputs = make_inputs(shape, dtype, rng)
                expected = reference_of(**inputs)
                tolerance = reference.TOLERANCES[dtype]
                try:
                    error, seconds = _run_case(handle, operator_class, inputs, expected, statistics)
                except NotImplementedStatusError:  # what the library or its CANN install lacks (named by the error)
                    print(row.format(name, dtype.name, str(shape), "-", "-", "n/a", "-"))
                    continue
                except InfiniopError as failure:
                    failures += 1
                    print(row.format(name, dtype.name, str(shape), "-", f"{tolerance:.1e}", "FAIL", "-"))
                    print(f"    {failure}")
                    continue
                passed = bool(error <= tolerance)
                failures += not passed
                print(row.format(name, dtype.name, str(shape), f"{error:.3e}", f"{tolerance:.1e}",
                                 "PASS" if passed else "FAIL", f"{seconds * 1e3:.3f} ms"))
    print("all passed" if failures == 0 else f"{failures} failed")
    return 1 if failures else 0


def main(argv=None):
    try:
        status = _main(argv)
        sys.stdout.flush()  # here, so that a closed pipe is met inside the try, not at exit
        return status
    except BrokenPipeError:
        # The reader went away (`infiniop-py smoke | head`): stop quietly. Pointing stdout at /dev/null keeps
        # Python's own flush at exit from raising again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def count(minimum):
    """An argparse type: an int of at least ``minimum`` (device ids, seeds, repeats), else argparse's error naming
    the option. `bench --visits 0` raised ZeroDivisionError after the timing, negative repeats ran with a hidden
    minimum, a negative seed gave numpy's traceback (2026-12-08)."""
    def parse(text):
        value = int(text)  # argparse turns its ValueError into "invalid count value"
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, not {value}")
        return value
    parse.__name__ = "count"
    return parse


def _main(argv):
    parser = argparse.ArgumentParser(
        prog="infiniop-py", description="RMSNorm, LayerNorm and BatchNorm backward (InfiniCore's C ABI): check and time.")
    commands = parser.add_subparsers(dest="command", required=True)
    smoke_parser = commands.add_parser("smoke", help="check every operator and dtype against a float64 reference",
                                       description="Check every operator and dtype against a float64 reference.")
    smoke_parser.add_argument("--device", default="cpu", type=resolve_alias, choices=BUILT_DEVICES,
                              help="the backend to check (cuda: nvidia; exit 2, with the reason, where it is "
                                   "missing)")
    smoke_parser.add_argument("--device-id", type=count(0), default=0)
    smoke_parser.add_argument("--seed", type=count(0), default=0)
    commands.add_parser("bench", help="time every operator against PyTorch and a copy (bench --help)")
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:  # bench has its own parser (also scripts/bench.py)
        from . import bench
        return bench.main(argv[1:])
    arguments = parser.parse_args(argv)
    try:
        return smoke(arguments.device, arguments.device_id, arguments.seed)
    except LibraryNotFoundError as error:
        print(f"infiniop-py: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
