"""Finding the native libraries: library_path(), the search order, and the error that lists every try."""

import os
import pathlib
import shutil
import subprocess
import sys

import infiniop_py

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
PROBE = "import infiniop_py; print(infiniop_py.library_path())"


def run_python(code, env_changes, cwd, pythonpath):
    env = {k: v for k, v in os.environ.items()
           if k not in ("INFINIOP_PY_LIBRARY_DIR", "INFINI_ROOT", "LD_LIBRARY_PATH", "PYTHONPATH")}
    env.update(env_changes, PYTHONPATH=str(pythonpath))
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def package_copy_without_bundled_libraries(tmp_path):
    """The package's Python files alone, so the bundled-copy step of the search finds nothing."""
    destination = tmp_path / "site" / "infiniop_py"
    shutil.copytree(pathlib.Path(infiniop_py.__file__).parent, destination,
                    ignore=shutil.ignore_patterns("lib", "__pycache__", "*.so"))
    return destination.parent


def test_library_path_is_an_existing_libinfiniop():
    path = pathlib.Path(infiniop_py.library_path())
    assert path.is_file() and path.name.startswith("libinfiniop")
    if os.environ.get("INFINIOP_PY_LIBRARY_DIR"):
        assert path.parent == pathlib.Path(os.environ["INFINIOP_PY_LIBRARY_DIR"]).resolve()


def test_every_failed_place_is_listed(tmp_path):
    empty_library_dir, empty_root = tmp_path / "empty", tmp_path / "root"
    empty_library_dir.mkdir()
    empty_root.mkdir()
    site = package_copy_without_bundled_libraries(tmp_path)

    result = run_python(PROBE, {"INFINIOP_PY_LIBRARY_DIR": str(empty_library_dir), "INFINI_ROOT": str(empty_root)},
                        cwd=tmp_path, pythonpath=site)

    assert result.returncode != 0
    assert "LibraryNotFoundError" in result.stderr
    for place in (str(empty_library_dir), str(empty_root / "lib"), str(site / "infiniop_py" / "lib"),
                  "system loader"):
        assert place in result.stderr, f"{place} missing from:\n{result.stderr}"


def test_search_falls_through_an_empty_directory_to_infini_root(tmp_path):
    installed = pathlib.Path(infiniop_py.library_path()).parent
    infini_root = tmp_path / "root"
    shutil.copytree(installed, infini_root / "lib")
    empty_library_dir = tmp_path / "empty"
    empty_library_dir.mkdir()

    result = run_python(PROBE, {"INFINIOP_PY_LIBRARY_DIR": str(empty_library_dir), "INFINI_ROOT": str(infini_root)},
                        cwd=tmp_path, pythonpath=package_copy_without_bundled_libraries(tmp_path))

    assert result.returncode == 0, result.stderr
    assert pathlib.Path(result.stdout.strip()) == (infini_root / "lib" / "libinfiniop.so").resolve()


def test_library_dir_variable_comes_first(tmp_path):
    installed = pathlib.Path(infiniop_py.library_path()).parent
    first, second = tmp_path / "first", tmp_path / "second"
    shutil.copytree(installed, first)
    shutil.copytree(installed, second / "lib")

    result = run_python(PROBE, {"INFINIOP_PY_LIBRARY_DIR": str(first), "INFINI_ROOT": str(second)},
                        cwd=tmp_path, pythonpath=REPO_ROOT)

    assert result.returncode == 0, result.stderr
    assert pathlib.Path(result.stdout.strip()) == (first / "libinfiniop.so").resolve()


def test_import_does_not_need_the_library(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    result = run_python("import infiniop_py; print(infiniop_py.__version__)",
                        {"INFINIOP_PY_LIBRARY_DIR": str(empty), "INFINI_ROOT": str(empty)},
                        cwd=tmp_path, pythonpath=package_copy_without_bundled_libraries(tmp_path))
    assert result.returncode == 0, result.stderr


def test_an_unbuilt_source_tree_that_shadows_an_install_says_so(tmp_path, monkeypatch):
    """The clone's root after `pip install .`: `import infiniop_py` finds the source tree (no lib/) before the
    installed package; the error says which shadows which and what to do, above the list of paths tried."""
    from importlib import metadata

    from infiniop_py import _ffi

    installed = tmp_path / "site-packages" / "infiniop_py"
    (installed / "lib").mkdir(parents=True)
    library = installed / "lib" / _ffi.shared_library_name("infiniop")
    library.write_bytes(b"")

    class Installed:
        metadata = {"Name": "infiniop-py"}
        files = [type("Entry", (), {"locate": lambda self: library})()]

    class SourceTreeEggInfo:  # what the build leaves in the source tree, found first from its root
        metadata = {"Name": "infiniop_py"}
        files = None

    monkeypatch.setattr(_ffi, "BUNDLED_DIR", str(tmp_path / "source-tree" / "infiniop_py" / "lib"))
    monkeypatch.setattr(metadata, "distributions", lambda: [SourceTreeEggInfo(), Installed()])
    hint = _ffi._shadowing_hint()
    assert "shadows the installed package in " + str(installed) in hint
    assert "run Python from another directory" in hint and "pip install -e ." in hint
    monkeypatch.setattr(_ffi, "BUNDLED_DIR", str(installed / "lib"))  # the installed package itself: no hint
    assert _ffi._shadowing_hint() == ""


def test_c_programs_compile_against_include_dir(tmp_path):
    """infiniop_py.include_dir() holds the headers of the loaded libraries: a C program that uses every operator
    compiles against them, links with the libraries beside library_path(), and runs."""
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        import pytest
        pytest.skip("no C compiler on PATH")
    include = pathlib.Path(infiniop_py.include_dir())
    assert (include / "infiniop.h").is_file() and (include / "infinirt.h").is_file(), include
    library_dir = os.path.dirname(infiniop_py.library_path())
    program = tmp_path / "create_run_destroy"
    subprocess.run([compiler, "-std=c11", "-O1", "-Wall", "-Werror", "-I", str(include),
                    str(REPO_ROOT / "tests" / "native" / "create_run_destroy.c"), "-L", library_dir, "-linfiniop",
                    "-linfinirt", f"-Wl,-rpath,{library_dir}", "-o", str(program)], check=True, timeout=120)
    result = subprocess.run([str(program), "20"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
