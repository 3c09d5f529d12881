#!/usr/bin/env python3
"""Finds likely store-forwarding stalls in compiled code: a 128- or 256-bit load from the stack within 12
instructions of two or more narrower stores (general registers or scalar SSE) into its bytes. Such a load cannot
take its data from those stores and waits for them to reach the cache (about a dozen cycles each time). On the AVX2
build this pattern marked GCC splitting vectors it had no register for (docs/performance.md, "The AVX2 build's
short rows"). Static: a place found may be off the hot path; measure with scripts/ab.py.

    python scripts/forwarding_stalls.py infiniop_py/lib/libinfiniop.so [--show 3]

Prints the count by (load bits, stores), then the first --show places with the instructions before them. Run it
on an object file built with symbols (the library is stripped) to see the functions.
"""

import argparse
import collections
import re
import subprocess

LOAD = re.compile(r"vmov(?:dq[au]|[au]p[sd])\s+(-?0x[0-9a-f]+|)\(%rsp\),%(x|y)mm")
STORE = re.compile(r"\b(?:mov[lq]?\s+%[re]\w+|vmov(?:ss|sd|d|q)\s+%xmm\d+),(-?0x[0-9a-f]+|)\(%rsp\)")
WINDOW = 12


def disassembly(path):
    return subprocess.run(["objdump", "-d", "-C", "--no-show-raw-insn", path], capture_output=True, text=True,
                          check=True).stdout.splitlines()


def places(listing):
    """(function, instructions before, the load, load bits, stores) of each place in objdump's listing, in order."""
    window, function = [], ""
    for line in listing:
        if line.endswith(">:"):
            function = line
        load = LOAD.search(line)
        if load:
            begin = int(load.group(1) or "0", 16)
            size = 32 if load.group(2) == "y" else 16
            stores = 0
            for earlier in window:
                store = STORE.search(earlier)
                if store and begin <= int(store.group(1) or "0", 16) < begin + size:
                    stores += 1
            if stores >= 2:
                yield function, list(window), line, 8 * size, stores
        window = (window + [line])[-WINDOW:]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", help="a shared library or object file")
    parser.add_argument("--show", type=int, default=0, help="print this many places with their context")
    args = parser.parse_args()
    found = list(places(disassembly(args.path)))
    kinds = collections.Counter((bits, stores) for _, _, _, bits, stores in found)
    print(f"{len(found)} places; by (load bits, stores): {dict(sorted(kinds.items()))}")
    for function, window, line, _, _ in found[:args.show]:
        print(function[:160])
        print("\n".join(window + [line]))
        print("----")


if __name__ == "__main__":
    main()
