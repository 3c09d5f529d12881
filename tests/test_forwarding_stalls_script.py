"""scripts/forwarding_stalls.py: which stack loads it counts as unable to forward from the stores before them."""

import importlib.util
import pathlib

SCRIPT = pathlib.Path(__file__).resolve().parent.parent / "scripts" / "forwarding_stalls.py"
spec = importlib.util.spec_from_file_location("forwarding_stalls", SCRIPT)
forwarding_stalls = importlib.util.module_from_spec(spec)
spec.loader.exec_module(forwarding_stalls)

FUNCTION = "0000000000001000 <kernel(float*)>:"


def found(*instructions):
    return [(bits, stores) for _, _, _, bits, stores in forwarding_stalls.places([FUNCTION, *instructions])]


def test_a_wide_load_over_narrow_stores_is_found():
    assert found(
        "  10:\tmov    %rsi,0x40(%rsp)",
        "  18:\tmov    %rdi,0x48(%rsp)",
        "  20:\tvmovsd %xmm1,0x50(%rsp)",
        "  28:\tvmovdqa 0x40(%rsp),%ymm3",
    ) == [(256, 3)]
    assert found("  10:\tmovl   %eax,(%rsp)", "  14:\tmov    %rdx,0x8(%rsp)", "  18:\tvmovaps (%rsp),%xmm0") == [(128, 2)]


def test_loads_that_can_forward_are_not():
    # One store, a wide store, stores outside the load's bytes, or stores further back than the window.
    assert found("  10:\tmov    %rsi,0x40(%rsp)", "  18:\tvmovdqa 0x40(%rsp),%ymm3") == []
    assert found("  10:\tvmovdqa %ymm1,0x40(%rsp)", "  18:\tvmovdqa 0x40(%rsp),%ymm3") == []
    assert found("  10:\tmov    %rsi,0x60(%rsp)", "  18:\tmov    %rdi,0x38(%rsp)",
                 "  20:\tvmovdqa 0x40(%rsp),%ymm3") == []
    far_back = ["  10:\tmov    %rsi,0x40(%rsp)", "  18:\tmov    %rdi,0x48(%rsp)"]
    far_back += [f"  {0x20 + i:x}:\tadd    $0x1,%rax" for i in range(forwarding_stalls.WINDOW)]
    assert found(*far_back, "  80:\tvmovdqa 0x40(%rsp),%ymm3") == []
