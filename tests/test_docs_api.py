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
                                                 for c in ("BatchNormBackward", "DeviceArray")), name


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


@pytest.mark.parametrize("name", ["rms_norm", "rms_norm_backward", "layer_norm_backward", "batch_norm_backward"])
def test_functional_docstrings_name_every_keyword(name):
    function = getattr(infiniop_py, name)
    doc = inspect.getdoc(function)
    keywords = [p.name for p in inspect.signature(function).parameters.values() if p.kind is p.KEYWORD_ONLY]
    undocumented = [k for k in keywords if k not in doc]
    assert not undocumented, f"{name}'s docstring does not mention {undocumented}"


# The rows of api.md's entry point table, by the start of their first cell, and the emulated Ascend suite's cases
# (tests/ascend_emulation/ascend_suite.py, whose expected statuses tests/test_ascend_emulated.py holds the backend
# to) that exercise each.
ASCEND_CASES_OF_ROW = {
    "RMSNorm seed": lambda name: name.startswith("rms/"),
    "LayerNorm seed": lambda name: name.startswith("ln/"),
    "BatchNorm seed": lambda name: name.startswith("bn/"),
    "`infiniopCreateRMSNormBackwardDescriptorEx`": lambda name: name.startswith("rms-ex/"),
    "`infiniopCreateLayerNormBackwardDescriptorEx`": lambda name: (name.startswith("ln-ex/")
                                                                  and "/from-input" not in name),
    "`infiniopCreateLayerNormBackwardFromInputDescriptorEx`": lambda name: name.startswith("ln-ex/")
                                                                           and "/from-input" in name,
    "`infiniopCreateBatchNormBackwardDescriptorEx`": lambda name: name.startswith("bn-ex/") and "phase" not in name,
    "`infiniopBatchNormBackwardReduceEx`": lambda name: name.startswith("bn-ex/") and "phase" in name,
}

# The same for the table of each forward (under its heading; rows "seed" and the Ex create's).
ASCEND_FORWARD_CASES_OF_ROW = {
    op: {"seed": lambda name, prefix=prefix: name.startswith(prefix) and "/seed" in name,
         "`infiniopCreate": lambda name, prefix=prefix: name.startswith(prefix) and "/seed" not in name}
    for op, prefix in (("RMSNorm", "rms-fwd/"), ("LayerNorm", "ln-fwd/"), ("BatchNorm", "bn-fwd/"))
}


def _table_rows(text, header):
    """{first cell: last cell} of the first table of `text` whose header row starts with `header`."""
    table = text[text.index(header):]
    table = table[:table.index("\n\n")].splitlines()[2:]
    return {row.split("|")[1].strip(): row.strip().strip("|").split("|")[-1].strip() for row in table}


def _entry_point_rows():
    return _table_rows(API_MD.read_text(), "| entry point |")


def _forward_rows(op):
    text = API_MD.read_text()
    return _table_rows(text[text.index(f"## The {op} forward"):], "| create |")


def _assert_ascend_claims(rows, cases_of_row):
    """Each row's backends cell says of Ascend one of: supported, "all but F64 (NOT_IMPLEMENTED)" or
    "NOT_IMPLEMENTED"; the Ascend suite's cases of that row must expect exactly that."""
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parent / "ascend_emulation"))
    import ascend_suite

    expected = {name: status for name, _, status in ascend_suite.cases()}
    assert len(rows) == len(cases_of_row), list(rows)
    for first_cell, backends in rows.items():
        start = next(key for key in cases_of_row if first_cell.startswith(key))
        cases = {name: status for name, status in expected.items() if cases_of_row[start](name)}
        assert cases, f"no Ascend case exercises {start}"
        not_implemented = {name for name, status in cases.items() if status == ascend_suite.NOT_IMPLEMENTED}
        f64 = {name for name in cases if "/F64/" in name}
        claim = backends.split("Ascend", 1)[1] if "Ascend" in backends else None
        if claim == "":  # "CPU, CUDA, Ascend"
            assert not not_implemented and not f64, (start, not_implemented | f64)
        elif claim == ": all but F64 (NOT_IMPLEMENTED)":
            assert f64 and not_implemented == f64, (start, sorted(not_implemented ^ f64))
        elif claim == ": NOT_IMPLEMENTED":
            assert not_implemented == set(cases), (start, sorted(set(cases) - not_implemented))
        else:
            pytest.fail(f"{start}: backends cell {backends!r} has a form this test does not know")


def test_the_ascend_support_api_md_states_is_what_the_emulated_backend_is_held_to():
    """The entry point table's Ascend claims (issue 55: api.md said the from-input LayerNorm was NOT_IMPLEMENTED on
    Ascend, which runs it)."""
    _assert_ascend_claims(_entry_point_rows(), ASCEND_CASES_OF_ROW)


@pytest.mark.parametrize("op", sorted(ASCEND_FORWARD_CASES_OF_ROW))
def test_the_ascend_support_of_each_forward_is_what_the_emulated_backend_is_held_to(op):
    """Each forward's table (issue 54: they said CPU, CUDA while Ascend ran them)."""
    _assert_ascend_claims(_forward_rows(op), ASCEND_FORWARD_CASES_OF_ROW[op])
