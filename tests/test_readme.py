"""The README runs as written (issue 25): every Python block, from a scratch directory, in its own process (the
multi-process example under torch.distributed.run on 2 processes of 127.0.0.1); it stays a short guide; its links
to docs/ lead somewhere; its speedup claims are its CPU table's (issue 55); its torch install line asks for the
torch extra's range."""

import os
import pathlib
import re
import socket
import statistics
import subprocess
import sys

import pytest

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_the_readme_is_a_short_guide_whose_links_resolve():
    text = README.read_text()
    assert len(text.splitlines()) <= 260
    for target in re.findall(r"\]\(((?:docs/)[^)#]+)", text):
        assert (README.parent / target).is_file(), target


def _free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("block", BLOCKS, ids=[f"block{index}" for index in range(len(BLOCKS))])
def test_each_python_block_runs_as_written(block, tmp_path):
    if "torch" in block:
        pytest.importorskip("torch", reason="torch is not installed: this README block uses it")
    script = tmp_path / "train_sync.py"  # the name the README gives the multi-process example
    script.write_text(block)
    command = [sys.executable, str(script)]
    if "init_process_group" in block:
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr",
                   "127.0.0.1", "--master-port", str(_free_port()), str(script)]
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(command, cwd=tmp_path, env=dict(environment, OMP_NUM_THREADS="1"), capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]


def _cpu_table():
    """The rows of the README's CPU benchmark table (the first table under "## Performance"), as dicts by header."""
    section = README.read_text().split("\n## Performance\n", 1)[1]
    table = re.search(r"^\|.*\|\n(?:\|.*\|\n)+", section, flags=re.M).group(0).splitlines()
    header = [cell.strip() for cell in table[0].strip("|").split("|")]
    return [dict(zip(header, (cell.strip() for cell in row.strip("|").split("|")))) for row in table[2:]]


def _speedups(rows, column):
    """The column's speedups ("30.33x"), leaving out the rows without one ("-")."""
    values = [row[column] for row in rows if row[column] != "-"]
    assert values and all(value.endswith("x") for value in values), (column, values)
    return [float(value[:-1]) for value in values]


def test_the_speedup_claims_are_the_tables():
    """The opening paragraph's ranges are the min-max of the CPU table's speedup columns, and the line under the
    table gives their medians and minimums."""
    text = README.read_text()
    rows = _cpu_table()
    assert len(rows) >= 20, rows
    torch_speedups, onednn_speedups = _speedups(rows, "vs torch"), _speedups(rows, "vs oneDNN")
    opening = text[:text.index("\n## ")]
    claimed = re.search(r"in the table below [^,]*, ([\d.]+)-([\d.]+)x faster than\s+PyTorch's backward and "
                        r"([\d.]+)-([\d.]+)x faster than\s+oneDNN's", opening)
    assert claimed, "the opening paragraph's speedup ranges have another form: update this test with them"
    assert [float(value) for value in claimed.groups()] == [min(torch_speedups), max(torch_speedups),
                                                             min(onednn_speedups), max(onednn_speedups)]
    summary = re.search(r"Median speedup over torch ([\d.]+)x \(slowest ([\d.]+)x\), over oneDNN ([\d.]+)x "
                        r"\(slowest ([\d.]+)x", text)
    assert summary, "the line under the CPU table has another form: update this test with it"
    median_torch, slowest_torch, median_onednn, slowest_onednn = (float(value) for value in summary.groups())
    assert (slowest_torch, slowest_onednn) == (min(torch_speedups), min(onednn_speedups))
    # The table's speedups are rounded to 0.01: a median of two of them may differ by half of that.
    assert abs(median_torch - statistics.median(torch_speedups)) <= 0.0051, statistics.median(torch_speedups)
    assert abs(median_onednn - statistics.median(onednn_speedups)) <= 0.0051, statistics.median(onednn_speedups)


def test_the_torch_install_line_asks_for_the_torch_extras_range():
    """A user installs torch from PyTorch's CPU index, then the package with its torch extra: the range the first
    command asks for must be the extra's, or pip would replace that torch with another build."""
    text = README.read_text()
    pyproject = (README.parent / "pyproject.toml").read_text()
    extra = re.search(r'^torch = \["torch([^"]+)"\]', pyproject, flags=re.M)
    assert extra, "pyproject.toml's torch extra has another form: update this test with it"
    command = re.search(r'^pip install "torch([^"]+)" --index-url https://download\.pytorch\.org/whl/cpu '
                        r'&& pip install "\.\[torch\]"$', text, flags=re.M)
    assert command, "the README's torch install command has another form: update this test with it"
    assert command.group(1) == extra.group(1)
