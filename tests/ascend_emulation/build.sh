#!/bin/sh
# Builds the emulated CANN libraries (test use only) into $1/built and lays them out as CANN installs of several
# generations, each a directory with a lib64/ to point $ASCEND_TOOLKIT_HOME at:
#   $1/split     libopapi_nn.so + libopapi_math.so and no libopapi.so (current CANN, the deprecated one gone)
#   $1/legacy    one libopapi.so holding every operator (CANN before the split)
#   $1/train     libaclnn_ops_train.so + libaclnn_math.so (older CANN's names)
#   $1/shadowed  the split libraries beside a stale libopapi.so whose every operator fails: the split ones must win
#   $1/nn-only   libopapi_nn.so alone: the elementwise operators (aclnnCast, Adds, Rsqrt, Div) are missing
set -e
root="$1"
src="$(cd "$(dirname "$0")" && pwd)"
built="$root/built"
mkdir -p "$built"
cxx="${CXX:-g++}"
flags="-std=c++17 -O2 -Wall -Wextra -Wno-unused-parameter -fPIC"

$cxx $flags -shared -pthread "$src/ascendcl.cc" -Wl,-soname,libascendcl.so -o "$built/libascendcl.so"
$cxx $flags -shared "$src/nnopbase.cc" -Wl,-soname,libnnopbase.so -o "$built/libnnopbase.so"
$cxx $flags -c "$src/opapi_nn.cc" -o "$built/opapi_nn.o"
$cxx $flags -c "$src/opapi_math.cc" -o "$built/opapi_math.o"
$cxx $flags -O0 -DASCEND_EMULATION_DECOY -c "$src/opapi_nn.cc" -o "$built/decoy_nn.o"
$cxx $flags -O0 -DASCEND_EMULATION_DECOY -c "$src/opapi_math.cc" -o "$built/decoy_math.o"

operators() { # operators LIBRARY OBJECT...
    out="$1"
    shift
    (cd "$built" && $cxx -shared "$@" -L. -lascendcl -lnnopbase -o "$out")
}
operators libopapi_nn.so opapi_nn.o
operators libopapi_math.so opapi_math.o
operators libopapi_all.so opapi_nn.o opapi_math.o
operators libopapi_decoy.so decoy_nn.o decoy_math.o

install_as() { # install_as LAYOUT NAME=BUILT...
    dir="$root/$1/lib64"
    shift
    mkdir -p "$dir"
    ln -sf "$built/libascendcl.so" "$built/libnnopbase.so" "$dir/"
    for pair in "$@"; do ln -sf "$built/${pair#*=}" "$dir/${pair%%=*}"; done
}
install_as split libopapi_nn.so=libopapi_nn.so libopapi_math.so=libopapi_math.so
install_as legacy libopapi.so=libopapi_all.so
install_as train libaclnn_ops_train.so=libopapi_nn.so libaclnn_math.so=libopapi_math.so
install_as shadowed libopapi_nn.so=libopapi_nn.so libopapi_math.so=libopapi_math.so libopapi.so=libopapi_decoy.so
install_as nn-only libopapi_nn.so=libopapi_nn.so
