"""docs/api.md leaves the Python arguments to the docstrings: every public name it points to exists, and every
public class, method and function of the package (and of infiniop_py.torch) has a docstring to point to."""

import inspect
import re
from pathlib import Path

import pytest

import infiniop_py

API_MD = Path(__file__).resolve().parent.parent / "docs" / "api.md"


def _public_callables(module):
    for name in module.__all__:
        obj = getattr(module, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            yield f"{module.__name__}.{name}", obj
            if inspect.isclass(obj):
                for attr, member in vars(obj).items():
                    if not attr.startswith("_") and inspect.isfunction(member):
                        yield f"{module.__name__}.{name}.{attr}", member


def test_every_name_api_md_points_to_exists():
    text = API_MD.read_text()
    paragraph = text[text.index("In Python, each entry point"):]
    paragraph = paragraph[:paragraph.index("\n\n")]
    names = re.findall(r"`([A-Za-z_][A-Za-z_0-9]*)`", paragraph)
    assert len(names) >= 9, names
    for name in names:
        assert hasattr(infiniop_py, name) or any(hasattr(getattr(infiniop_py, c, None), name)
                                                 for c in ("BatchNormBackward",)), name


def test_every_public_callable_has_a_docstring():
    modules = [infiniop_py]
    try:
        import infiniop_py.torch as integration
        modules.append(integration)
    except ImportError:  # the base package's callables are still checked
        pass
    missing = [name for module in modules for name, obj in _public_callables(module)
               if not (inspect.getdoc(obj) or "").strip()]
    assert not missing, f"public callables without a docstring: {missing}"


@pytest.mark.parametrize("name", ["rms_norm_backward", "layer_norm_backward", "batch_norm_backward"])
def test_functional_docstrings_name_every_keyword(name):
    function = getattr(infiniop_py, name)
    doc = inspect.getdoc(function)
    keywords = [p.name for p in inspect.signature(function).parameters.values() if p.kind is p.KEYWORD_ONLY]
    undocumented = [k for k in keywords if k not in doc]
    assert not undocumented, f"{name}'s docstring does not mention {undocumented}"
