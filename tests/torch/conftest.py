"""The torch tests run this library's path at every size: most use tiny tensors, which on the CPU the functionals
give to torch's own norms end to end (functional._TORCH_BELOW). Tests of that choice set the sizes back."""

import pytest


@pytest.fixture(autouse=True)
def _ours_at_every_size(monkeypatch):
    try:
        from infiniop_py.torch import functional
    except ImportError:  # torch is not installed: the modules skip themselves
        return
    monkeypatch.setattr(functional, "_TORCH_BELOW", {})


@pytest.fixture
def python_functions(monkeypatch):
    """The eager path through the Python Functions (ops.EAGER), the C++ autograd nodes set aside: for tests of what
    those Functions do themselves."""
    from infiniop_py.torch import autograd_nodes

    monkeypatch.setattr(autograd_nodes, "_state", (None, "set aside by the test"))
