"""C/C++ helpers compiled on first use, with the machine's compiler, into the user's cache: bench/onednn.py's oneDNN
timer and torch/autograd_nodes.py's autograd nodes. Callers name a build by what it depends on (its path carries a
hash of that) and look it up before compiling."""

import os
import subprocess
from pathlib import Path


def cache_dir():
    """~/.cache/infiniop-py, or $XDG_CACHE_HOME/infiniop-py."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "infiniop-py"


def compile_to(target, command):
    """Run the compiler command (``command``, without its output) so that it writes ``target``: into a file of this
    process first, renamed into place whole, so that a concurrent build or load never sees a partial one.
    RuntimeError with the compiler's last words (or why it could not run)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(f".{os.getpid()}.tmp")
    try:
        built = subprocess.run([*command, "-o", str(partial)], capture_output=True, text=True)
    except OSError as error:  # no such compiler
        raise RuntimeError(f"cannot run the compiler {command[0]!r}: {error}") from None
    if built.returncode != 0:
        partial.unlink(missing_ok=True)
        raise RuntimeError(built.stderr.strip()[-800:])
    os.replace(partial, target)
