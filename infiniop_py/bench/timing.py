"""What every benchmark shares: medians of interleaved rounds, the bare C call of an operator object, the
machine's description and the progress line."""

import os
import platform
import statistics
import sys
import time

import infiniop_py


def median_seconds(run, repeats, min_seconds=0.2):
    """Median wall time of run() over at least `repeats` calls (after one warm-up call)."""
    run()
    times = []
    started = time.perf_counter()
    while len(times) < repeats or time.perf_counter() - started < min_seconds:
        begin = time.perf_counter()
        run()
        times.append(time.perf_counter() - begin)
        if len(times) >= 20 * repeats:
            break
    return statistics.median(times)


UNTIMED_CALLS = 2  # before each timed call of a run in interleaved_medians: why, in its docstring


def balanced_orders(count):
    """Orders of `count` runs (a Williams design) in which each run comes right after each other run equally
    often: twice in 2 x count orders where count is odd, once in count orders where it is even."""
    zigzag = [0]
    for step in range(1, count):  # 0, 1, n-1, 2, n-2, ...: consecutive differences hit every nonzero residue
        zigzag.append((step + 1) // 2 if step % 2 else count - step // 2)
    orders = [[(place + shift) % count for place in zigzag] for shift in range(count)]
    return orders + [order[::-1] for order in orders] if count % 2 and count > 1 else orders


def interleaved_medians(runs, repeats, min_seconds=0.05):
    """Median wall time of each callable in `runs`, timed in rounds: every round calls each in turn UNTIMED_CALLS
    times and then once more, timed, so each is timed right after itself, as in a loop of repeated calls. Right
    after the 256 MiB copy a call pays for writing back the copy's dirty cache lines and a small case finds the
    caches cold, and on the project's VMs that lasts beyond one call: with one untimed call, LayerNorm F32
    8192x128 took 0.34-0.37 ms behind the copy and 0.17-0.20 ms behind anything else, so a run's median depended on
    which runs shared its rounds (0.18-0.24 ms for the same bare call); with two, 0.18-0.21 and 0.17-0.20. The
    rounds go through balanced_orders, so each run follows each other run equally often, and what is left of that
    falls on all alike. All get the same rounds: at least `repeats`, and more until each has run min_seconds in
    all (at most 20 x repeats rounds), so a drift in the machine's speed reaches all of them alike. The fastest
    sets the count, so min_seconds stays small: at 0.2 s, torch's 200 ms RMSNorm ran 67 rounds beside our 3 ms
    one. The order depends only on the round, so processes running the same rounds call the same runs
    together."""
    times = [[] for _ in runs]
    totals = [0.0] * len(runs)
    orders = balanced_orders(len(runs))
    while len(times[0]) < repeats or min(totals) < min_seconds:
        for index in orders[len(times[0]) % len(orders)]:
            run = runs[index]
            for _ in range(UNTIMED_CALLS):
                run()
            begin = time.perf_counter()
            run()
            times[index].append(time.perf_counter() - begin)
            totals[index] += times[index][-1]
        if len(times[0]) >= 20 * repeats:
            break
    return [statistics.median(own) for own in times]


def progress(done, total, label):
    width = 30
    filled = width * done // total
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {label:<40}")
    sys.stderr.flush()
    if done == total:
        sys.stderr.write("\n")


def native_call(operator, addresses, workspace_address, stream_address=0):
    """The bare C call of an operator object on data addresses (C order; absent trailing tensors may be left
    out), for timing without the Python layer."""
    from .._ffi import ffi

    pointers = [ffi.cast("void *", address) for address in addresses]
    pointers += [ffi.NULL] * (len(operator.layouts) - len(pointers))
    native, run_native = operator._open_pointer(), operator._run_native
    workspace, size = ffi.cast("void *", workspace_address), operator.workspace_size
    stream = ffi.cast("void *", stream_address)
    return lambda: run_native(native, workspace, size, *pointers, stream)


def machine_description():
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    description = f"{model}, {os.cpu_count()} logical CPUs, {platform.system()} {platform.machine()}"
    # The ISA changes the CPU kernels' speed severalfold: a table says which one ran, as the library chose it (the
    # environment variable alone can be misspelt, which the library ignores).
    isa = infiniop_py.cpu_isa()
    if isa is None:
        return description
    forced_isa = os.environ.get("INFINIOP_CPU_ISA")
    return f"{description}, CPU kernels {isa}" + (f" (INFINIOP_CPU_ISA={forced_isa})" if forced_isa else "")
