"""The shared libraries export the C API and nothing else (everything internal has hidden visibility)."""

import os
import re
import shutil
import subprocess

import pytest

from infiniop_py._ffi import library_path

API_NAME = re.compile(r"^(infiniop|infinirt)[A-Z]\w*$")


def defined_dynamic_symbols(path):
    output = subprocess.run(["nm", "-D", "--defined-only", path], capture_output=True, text=True, check=True).stdout
    return [line.split()[-1] for line in output.splitlines() if len(line.split()) == 3]


@pytest.mark.skipif(shutil.which("nm") is None, reason="nm (binutils) is needed to list the exported symbols")
@pytest.mark.parametrize("library", ["libinfiniop.so", "libinfinirt.so"])
def test_only_the_c_api_is_exported(library):
    path = os.path.join(os.path.dirname(library_path()), library)
    symbols = defined_dynamic_symbols(path)
    assert any(API_NAME.match(name) for name in symbols), symbols
    assert [name for name in symbols if not API_NAME.match(name)] == []
