#!/usr/bin/env bash
# One line that changes whenever the native build's inputs do: a hash of every file under native/ and the xmake
# files, with their paths. Needs no git (a device machine gets a copy of the working tree). Used by
# prebuild_gpu.sh and verify_gpu.sh to tell whether gpu-lib/ was built from these sources.
set -euo pipefail
cd "$(dirname "$0")/.."
find native xmake.lua -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1
