#!/bin/sh
# Builds the emulated CANN libraries into $1/lib64 (the layout of $ASCEND_TOOLKIT_HOME): test use only.
set -e
out="$1/lib64"
src="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$out"
flags="-std=c++17 -O2 -Wall -Wextra -Wno-unused-parameter -fPIC -shared"
${CXX:-g++} $flags "$src/ascendcl.cc" -o "$out/libascendcl.so"
${CXX:-g++} $flags "$src/nnopbase.cc" -Wl,-soname,libnnopbase.so -o "$out/libnnopbase.so"
${CXX:-g++} $flags "$src/opapi.cc" -L"$out" -lnnopbase -o "$out/libopapi.so"
