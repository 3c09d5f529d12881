-- The only build system of the native code. No add_requires: xmake never downloads anything here.
set_project("infiniop-py")
set_version("0.1.0")
set_xmakever("2.8.0")
set_languages("c11", "cxx17")
add_rules("mode.release", "mode.debug")
set_defaultmode("release")

option("cpu")
    set_default(true)
    set_showmenu(true)
    set_description("Build the CPU backend")
option_end()

option("omp")
    set_default(true)
    set_showmenu(true)
    set_description("Use OpenMP in the CPU backend")
option_end()

option("nv-gpu")
    set_default(false)
    set_showmenu(true)
    set_description("Build the NVIDIA CUDA backend (needs nvcc)")
option_end()

option("nv-arch")
    set_default("sm_80,sm_90,compute_90")
    set_showmenu(true)
    set_description("The NVIDIA backend's targets, comma-separated: sm_XX machine code, compute_XX PTX (a GPU "
                    .. "session's prebuilt library takes sm_90 alone: scripts/prebuild_gpu.sh)")
option_end()

option("ascend-npu")
    set_default(true) -- compiles everywhere: CANN is found with dlopen at run time, never at build time
    set_showmenu(true)
    set_description("Build the Huawei Ascend backend (CANN is loaded at run time)")
option_end()

option("nv-emulation")
    set_default(false)
    set_showmenu(true)
    set_description("The NVIDIA backend built for the CPU emulation of CUDA in tests/native/cuda_emulation, so its "
                    .. "kernels run and are tested without a GPU (for .ci/sanitize; not with nv-gpu)")
option_end()

option("sanitize")
    set_default(false)
    set_showmenu(true)
    set_description("AddressSanitizer + UndefinedBehaviorSanitizer, any UB fatal (for .ci/sanitize; not with nv-gpu)")
option_end()

if has_config("sanitize") then
    -- -g1: the line tables a report's stack needs. Full -g made the instrumented libinfiniop.so 308 MB and its
    -- compiles about 1.5x as long (LayerNorm backward's AVX2 file: 234 s, 157 s with -g1).
    add_cxflags("-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer", "-g1")
    add_ldflags("-fsanitize=address,undefined")
    add_shflags("-fsanitize=address,undefined")
end

-- Everything but the C API stays hidden; backends are static libraries linked into the two shared ones.
set_symbols("hidden")
add_cxflags("-fvisibility=hidden", "-fPIC", "-Wall", "-Wextra", "-Wno-unused-parameter")
add_includedirs("native/include", "native/src")

includes("native/xmake/*.lua")

target("infinirt")
    set_kind("shared")
    add_files("native/src/runtime/*.cc")
    add_deps(infini_runtime_backends())
    add_runtime_defines()
    add_headerfiles("native/include/(**.h)")
target_end()

target("infiniop")
    set_kind("shared")
    add_deps("infinirt")
    add_rpathdirs("$ORIGIN") -- finds libinfinirt beside it, wherever the pair is installed
    add_files("native/src/infiniop/*.cc", "native/src/common/*.cc", "native/src/ops/*/operator.cc")
    add_deps(infini_op_backends())
    add_runtime_defines()
target_end()
