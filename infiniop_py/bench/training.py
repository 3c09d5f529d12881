"""Benchmark of training with the PyTorch integration (``infiniop-py bench --training``): a forward + backward
step of norm-heavy models with torch's norms (and transformers' LlamaRMSNorm) and after ``replace_norms``, and
each module's forward + backward (from a fixed grad_output) against its replacement, on the same data in one process, timed in interleaved
rounds (bench/timing.py's interleaved_medians; on a GPU each step ends with a synchronization); ratios of
medians. F32, and BF16 activations with F32 parameters (see _compare). On a GPU each step is also timed replayed
from a CUDA graph (_graphed_step), where the host's time per call drops out and the kernels alone count. On glibc
the process's malloc keeps freed memory from then on (keep_freed_memory)."""

import copy
import ctypes
import functools
import statistics

from .timing import interleaved_medians, machine_description

BATCH_TOKENS, WIDTH = (8, 512), 1024  # (batch, sequence) of the row-norm cases
IMAGES = (32, 64, 56, 56)  # (N, C, H, W) of the BatchNorm cases: ResNet's first stage
DTYPES = ("float32", "bfloat16")
# Rounds go on until each side has run this long: a module's step takes a few ms and its time moves with the VM's
# memory phases, so the default 0.05 s (7 rounds) let one run's ratio move by 10% or more.
MIN_SECONDS = 1.0
# glibc's malloc gives a step's freed activations (16-32 MiB each) back to the OS and the next step page-faults
# them in again: 7500-8700 faults per LayerNorm module step, half of its time on this project's VM, and noise
# that moved a module's ratio by 10% between runs. Tuned CPU training avoids that (PyTorch's tuning guide:
# jemalloc or tcmalloc); glibc does with these mallopt settings, the same as MALLOC_TRIM_THRESHOLD_ and
# MALLOC_MMAP_THRESHOLD_ in the environment.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
KEPT_BYTES = 1 << 30


def keep_freed_memory():
    """Make glibc's malloc keep up to KEPT_BYTES of freed memory and serve blocks below that from its heap; whether
    it did (False where the C library's malloc is another, or a sanitizer's)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return all([mallopt(option, KEPT_BYTES) == 1 for option in (M_TRIM_THRESHOLD, M_MMAP_THRESHOLD)])


@functools.lru_cache(maxsize=None)
def llama_rms_norm(torch):
    """transformers' LlamaRMSNorm as its forward computes (F32 statistics, the weight times the normalized input
    rounded to the input's dtype): the RMSNorm of Llama, Mistral and Qwen models, written outside torch.nn, which
    torch runs as a composite of elementwise ops and replace_norms(rms_norms=[...]) swaps."""
    class LlamaRMSNorm(torch.nn.Module):
        def __init__(self, size, eps=1e-6):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(size))
            self.variance_epsilon = eps

        def forward(self, hidden_states):
            wide = hidden_states.float()
            normalized = wide * torch.rsqrt(wide.square().mean(-1, keepdim=True) + self.variance_epsilon)
            return self.weight * normalized.to(hidden_states.dtype)

    return LlamaRMSNorm


def _models(torch):
    class TransformerMLP(torch.nn.Module):
        """Four pre-norm blocks: LayerNorm, Linear, GELU, RMSNorm, residual."""

        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList(
                torch.nn.Sequential(torch.nn.LayerNorm(WIDTH), torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU(),
                                    torch.nn.RMSNorm(WIDTH)) for _ in range(4))

        def forward(self, x):
            for block in self.blocks:
                x = x + block(x)
            return x

    class LlamaMLP(torch.nn.Module):
        """Four pre-norm blocks as Llama's: LlamaRMSNorm, Linear, SiLU, residual; then a final LlamaRMSNorm."""

        def __init__(self):
            super().__init__()
            rms_norm = llama_rms_norm(torch)
            self.blocks = torch.nn.ModuleList(
                torch.nn.Sequential(rms_norm(WIDTH), torch.nn.Linear(WIDTH, WIDTH), torch.nn.SiLU()) for _ in range(4))
            self.norm = rms_norm(WIDTH)

        def forward(self, x):
            for block in self.blocks:
                x = x + block(x)
            return self.norm(x)

    class DepthwiseConvNet(torch.nn.Module):
        """Three depthwise 3x3 convolutions, each followed by BatchNorm2d and ReLU (MobileNet-like)."""

        def __init__(self):
            super().__init__()
            channels = IMAGES[1]
            self.layers = torch.nn.Sequential(*(
                layer for _ in range(3) for layer in (
                    torch.nn.Conv2d(channels, channels, 3, padding=1, groups=channels, bias=False),
                    torch.nn.BatchNorm2d(channels), torch.nn.ReLU())))

        def forward(self, x):
            return self.layers(x)

    return {"transformer MLP (4x LayerNorm + RMSNorm)": (TransformerMLP, (*BATCH_TOKENS, WIDTH)),
            "Llama-style MLP (5x LlamaRMSNorm)": (LlamaMLP, (*BATCH_TOKENS, WIDTH)),
            "depthwise conv net (3x BatchNorm2d)": (DepthwiseConvNet, IMAGES)}


RESNET_NAME = "ResNet-50 (torchvision, channels_last)"
RESNET_IMAGES = (128, 3, 224, 224)


def _resnet50():
    """torchvision's resnet50 constructor, or None where torchvision does not import. Timed on GPUs only: on a CPU
    its convolutions, not its 53 BatchNorm2d layers, take the step's time."""
    try:
        import torchvision
    except ImportError:
        return None
    return torchvision.models.resnet50


def _modules(torch):
    return {"RMSNorm": (lambda: torch.nn.RMSNorm(WIDTH), (*BATCH_TOKENS, WIDTH)),
            "LlamaRMSNorm (transformers' forward)": (lambda: llama_rms_norm(torch)(WIDTH), (*BATCH_TOKENS, WIDTH)),
            "LayerNorm": (lambda: torch.nn.LayerNorm(WIDTH), (*BATCH_TOKENS, WIDTH)),
            "BatchNorm2d": (lambda: torch.nn.BatchNorm2d(IMAGES[1]), IMAGES)}


def _forward_backward(torch, model, x, autocast, grad_output=None, cache_enabled=True):
    """One forward + backward (the optimizer's step is the same for both and left out): of a loss (a model), or, given
    ``grad_output``, of the output itself (a module alone: its own forward and backward, nothing else; a loss on a
    module's output costs as much as the norm's own step, the same on both sides, and would dilute the ratio)."""
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=autocast, cache_enabled=cache_enabled):
        output = model(x)
        if grad_output is None:
            output = output.float().square().mean()
    output.backward(grad_output)


def _clear_gradients(model, x):
    for parameter in model.parameters():
        parameter.grad = None
    x.grad = None


def _training_step(torch, model, x, autocast, grad_output=None):
    """A step of _forward_backward from cleared gradients, ending with a synchronization on a GPU."""
    def step():
        _clear_gradients(model, x)
        _forward_backward(torch, model, x, autocast, grad_output)
        if x.device.type == "cuda":
            torch.cuda.synchronize(x.device)
    return step


def _graphed_step(torch, model, x, autocast, grad_output=None):
    """The step of _training_step captured in a CUDA graph: its replay, then a synchronization. Warmed up first on
    a side stream (torch's recipe), so that cuDNN's choices and each norm layout's first, checked call happen
    outside the capture. The gradients are set to None before the capture, so the captured backward writes them
    afresh at each replay instead of accumulating; autocast's cast cache is off, as a graph must not keep casts
    made outside it."""
    side = torch.cuda.Stream(x.device)
    side.wait_stream(torch.cuda.current_stream(x.device))
    with torch.cuda.stream(side):
        for _ in range(3):
            _clear_gradients(model, x)
            _forward_backward(torch, model, x, autocast, grad_output, cache_enabled=False)
    torch.cuda.current_stream(x.device).wait_stream(side)
    _clear_gradients(model, x)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _forward_backward(torch, model, x, autocast, grad_output, cache_enabled=False)

    def replay():
        graph.replay()
        torch.cuda.synchronize(x.device)
    replay.graph = graph  # kept alive with the callable (its memory pool holds the step's tensors)
    return replay


def _compare(torch, make, shape, dtype, repeats, device, module, channels_last=False):
    """{torch_s, ours_s, speedup} of a training step of make() with torch's norms and with replace_norms. BF16: the
    models under autocast, which gives their norms BF16 activations from the layers before them; a module alone
    gets BF16 input (autocast leaves norms' inputs as they come)."""
    import infiniop_py.torch as ipt

    torch.manual_seed(0)
    memory_format = torch.channels_last if channels_last else torch.preserve_format
    theirs = make().to(device, memory_format=memory_format)
    ours = copy.deepcopy(theirs)
    replaced = ipt.replace_norms(ours, rms_norms=[llama_rms_norm(torch)])
    autocast = dtype == "bfloat16"
    x = torch.randn(shape, device=device, dtype=torch.bfloat16 if autocast and module else None)
    x = x.to(memory_format=memory_format).requires_grad_()
    grad_output = None
    if module:  # of the output's shape, dtype (F32 where torch's mixed-dtype forward gives it) and layout
        with torch.no_grad(), torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=autocast):
            grad_output = torch.randn_like(theirs(x))
    torch_s, ours_s = interleaved_medians([_training_step(torch, theirs, x, autocast, grad_output),
                                           _training_step(torch, ours, x, autocast, grad_output)], repeats, MIN_SECONDS)
    result = {"dtype": dtype, "input_dtype": str(x.dtype).removeprefix("torch."), "shape": list(shape),
              "replaced": replaced, "torch_s": torch_s, "ours_s": ours_s, "speedup": torch_s / ours_s}
    if device.type == "cuda":  # the same steps replayed from CUDA graphs: the kernels without the host's time
        try:
            steps = [_graphed_step(torch, model, x, autocast, grad_output) for model in (theirs, ours)]
        except RuntimeError as error:  # a step that cannot be captured loses its graph columns, not the table
            result["graph_error"] = str(error).splitlines()[0]
        else:
            torch_graph_s, ours_graph_s = interleaved_medians(steps, repeats, MIN_SECONDS)
            result.update(torch_graph_s=torch_graph_s, ours_graph_s=ours_graph_s,
                          graph_speedup=torch_graph_s / ours_graph_s)
        steps = None  # each graph's pool holds a step's activations (ResNet-50: gigabytes)
    return result


def run(repeats=7, dtypes=DTYPES, device="cpu"):
    """The report; ``device``: a torch device ("cpu", "cuda:0")."""
    import torch

    device = torch.device(device)
    machine = torch.cuda.get_device_name(device) if device.type == "cuda" else machine_description()
    report = {"machine": machine, "threads": torch.get_num_threads(), "device": str(device),
              "torch_version": torch.__version__, "keeps_freed_memory": keep_freed_memory(),
              "models": [], "modules": []}
    resnet50 = _resnet50() if device.type == "cuda" else None
    if device.type == "cuda" and resnet50 is None:
        report["left_out"] = f"{RESNET_NAME}: torchvision is not installed"
    if resnet50 is not None and "bfloat16" in dtypes:  # BF16 autocast, as ResNet-50 trains on GPUs
        result = _compare(torch, resnet50, RESNET_IMAGES, "bfloat16", repeats, device, module=False,
                          channels_last=True)
        report["models"].append({"name": RESNET_NAME, **result})
    for kind, table in (("models", _models(torch)), ("modules", _modules(torch))):
        for name, (make, shape) in table.items():
            for dtype in dtypes:
                result = _compare(torch, make, shape, dtype, repeats, device, module=kind == "modules")
                report[kind].append({"name": name, **result})
    return report


def format_table(report):
    lines = [f"machine: {report['machine']}; device: {report['device']}; threads: {report['threads']}; "
             f"torch {report['torch_version']}",
             "one forward + backward, torch's norms vs replace_norms; bfloat16: F32 parameters, models under autocast, "
             "modules on BF16 input; malloc: "
             + ("keeps freed memory (mallopt)" if report["keeps_freed_memory"] else "the C library's defaults"), ""]
    graphed = any("graph_speedup" in r or "graph_error" in r for r in report["models"] + report["modules"])
    if graphed:
        lines += ["graph: the same step replayed from a CUDA graph on each side (the host's time left out)", ""]
    for kind, title in (("models", "model"), ("modules", "module")):
        header = f"| {title} | dtype | shape | torch ms | ours ms | speedup |"
        rule = "|---|---|---|---:|---:|---:|"
        if graphed:
            header += " torch graph ms | ours graph ms | graph speedup |"
            rule += "---:|---:|---:|"
        lines += [header, rule]
        for r in report[kind]:
            shape = "x".join(map(str, r["shape"]))
            row = (f"| {r['name']} | {r['dtype']} | {shape} | {r['torch_s'] * 1e3:.2f} | "
                   f"{r['ours_s'] * 1e3:.2f} | {r['speedup']:.2f}x |")
            if graphed and "graph_speedup" in r:
                row += (f" {r['torch_graph_s'] * 1e3:.2f} | {r['ours_graph_s'] * 1e3:.2f} | "
                        f"{r['graph_speedup']:.2f}x |")
            elif graphed:
                row += " - | - | - |"
            lines.append(row)
        lines.append("")
        lines += [f"not captured: {r['name']} {r['dtype']}: {r['graph_error']}" for r in report[kind]
                  if "graph_error" in r]
    if "left_out" in report:
        lines.append(f"left out: {report['left_out']}")
    speedups = [r["speedup"] for r in report["models"]]
    lines.append(f"median training-step speedup: {statistics.median(speedups):.2f}x")
    speedups = [r["graph_speedup"] for r in report["models"] if "graph_speedup" in r]
    if speedups:
        lines.append(f"median training-step speedup in CUDA graphs: {statistics.median(speedups):.2f}x")
    return "\n".join(lines)
