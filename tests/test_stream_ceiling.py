"""scripts/stream_ceiling.py builds its streaming loops and times them against torch's copy_ in the same rounds."""

import os
import platform
import shutil

import pytest

from _scripts import load_script


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the script's loops are x86-64 (SSE2)")
def test_every_loop_is_timed_and_set_against_the_torch_copy(capsys):
    pytest.importorskip("torch", reason="the reference copy is torch's copy_")
    if shutil.which(os.environ.get("CC", "cc")) is None:
        pytest.skip("no C compiler (cc or $CC) to build the script's loops")
    assert load_script("stream_ceiling").main(["--rounds", "2", "--mib", "4"]) == 0
    table = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(table) if line.startswith("loop"))
    rows = {line[:24].strip(): line[24:].split() for line in table[header + 1:]}
    assert list(rows) == ["torch copy_", "copy, cached stores", "copy, streamed stores", "2 in + 1 out, streamed"]
    for name, (median, low, high, ratio) in rows.items():
        assert 0 < float(low) <= float(median) <= float(high), name
        assert float(ratio) > 0, name
    assert rows["torch copy_"][3] == "1.00"


def test_it_refuses_other_machines(monkeypatch, capsys):
    module = load_script("stream_ceiling")
    monkeypatch.setattr(module.platform, "machine", lambda: "aarch64")
    assert module.main([]) == 2
    assert "x86-64 only" in capsys.readouterr().err
