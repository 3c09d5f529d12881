"""The package's cdef matches the public C headers: every exported function (name, return type, parameter
types) and every enum value."""

import pathlib
import re

import pytest

from infiniop_py import _ffi
from _helpers import native

INCLUDE_DIR = pathlib.Path(__file__).resolve().parent.parent / "native" / "include"


def _strip_comments(text):
    return re.sub(r"//[^\n]*", "", re.sub(r"/\*.*?\*/", "", text, flags=re.S))


def _normalize_type(text):
    text = re.sub(r"\s+", " ", text).strip()
    return re.sub(r"\s*\*\s*", "*", text)


def _parameter_types(parameters):
    parameters = parameters.strip()
    if parameters in ("", "void"):
        return ()
    types = []
    for parameter in parameters.split(","):
        match = re.fullmatch(r"(.*?[\s*])(\w+)", parameter.strip(), flags=re.S)
        assert match, f"unnamed parameter {parameter!r}"
        types.append(_normalize_type(match.group(1)))
    return tuple(types)


def _functions(text, prefix):
    """{name: (return type, parameter types)} of the declarations that start with `prefix`."""
    pattern = re.compile(prefix + r"(\w[\w\s*]*?)\b(\w+)\s*\(([^)]*)\)\s*;", flags=re.S)
    return {m.group(2): (_normalize_type(m.group(1)), _parameter_types(m.group(3)))
            for m in pattern.finditer(_strip_comments(text))}


def _enums(text):
    """{enum type name: {member: value}} with C's implicit numbering."""
    enums = {}
    for body, name in re.findall(r"typedef\s+enum\s*\{(.*?)\}\s*(\w+)\s*;", _strip_comments(text), flags=re.S):
        members, value = {}, -1
        for entry in filter(None, (e.strip() for e in body.split(","))):
            member, _, explicit = entry.partition("=")
            value = int(explicit) if explicit.strip() else value + 1
            members[member.strip()] = value
        enums[name] = members
    return enums


def header_text():
    headers = sorted(INCLUDE_DIR.rglob("*.h"))
    assert len(headers) >= 9, headers
    return "\n".join(h.read_text() for h in headers)


HEADER_FUNCTIONS = _functions(header_text(), r"__C\s+__export\s+")
CDEF_FUNCTIONS = _functions(_ffi.CDEF, r"(?:^|;|\n)\s*")


def test_parser_finds_every_export():
    declarations = re.findall(r"^\s*__C\s+__export\b", _strip_comments(header_text()), flags=re.M)
    assert len(HEADER_FUNCTIONS) == len(declarations) > 20
    assert {"infiniopCreateRMSNormBackwardDescriptor", "infinirtSetDevice", "infiniopBatchNormBackward",
            "infiniopCreateLayerNormBackwardFromInputDescriptorEx", "infiniopLayerNormBackwardFromInputEx"} <= set(
        HEADER_FUNCTIONS)


def test_same_function_names():
    assert sorted(CDEF_FUNCTIONS) == sorted(HEADER_FUNCTIONS)


@pytest.mark.parametrize("name", sorted(HEADER_FUNCTIONS))
def test_same_signature(name):
    assert CDEF_FUNCTIONS.get(name) == HEADER_FUNCTIONS[name]


def test_same_enum_values():
    header_enums = _enums(header_text())
    assert {"infiniStatus_t", "infiniDevice_t", "infiniDtype_t", "infinirtMemcpyKind_t"} <= set(header_enums)
    assert _enums(_ffi.CDEF) == header_enums
    for enum_name, members in header_enums.items():
        assert _ffi.ffi.typeof(enum_name).relements == members, enum_name


@pytest.mark.parametrize("name", sorted(HEADER_FUNCTIONS))
def test_every_declared_function_is_in_the_loaded_library(name):
    _, op, rt = native()
    library = rt if name.startswith("infinirt") else op
    assert getattr(library, name) is not None


def test_by_address_types_only_the_pointers_after_descriptor_and_workspace_as_addresses():
    """The torch fast path's run functions (_ffi.by_address): the descriptor and the workspace stay pointers, sizes
    and other scalars keep their types, and every later pointer (the tensors' data, the stream) is a uintptr_t, the
    integer that a void * is passed as."""
    _, op, _ = native()
    ffi = _ffi.ffi
    run = ffi.typeof(op.infiniopBatchNormBackwardElementwiseEx)
    addressed = ffi.typeof(_ffi.by_address(op.infiniopBatchNormBackwardElementwiseEx))
    assert addressed.result is run.result
    assert [a.cname for a in addressed.args[:3]] == [a.cname for a in run.args[:3]]
    uintptr = ffi.typeof("uintptr_t")
    for original, typed in zip(run.args[2:], addressed.args[2:], strict=True):
        assert typed is (uintptr if original.kind == "pointer" else original), original.cname
    assert ffi.typeof("int64_t") in addressed.args  # total_count
