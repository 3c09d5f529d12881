-- CPU backend: runtime and operator kernels, each a static library linked into the shared ones.
if has_config("cpu") then
    -- The leaf kernels (*_simd.cc) are compiled once per ISA and picked at run time (devices/cpu/isa.h),
    -- so one build runs on any x86-64 and uses AVX-512 or AVX2 where the CPU has them.
    local multi_isa = is_arch("x86_64", "x64")
    local isa_flags = multi_isa and {avx512bf16 = {"-march=x86-64-v4", "-mavx512bf16"}, avx512 = {"-march=x86-64-v4"},
                                     avx2 = {"-march=x86-64-v3"}, generic = {}}
                                 or {generic = {}}

    for isa, flags in pairs(isa_flags) do
        target("infiniop-cpu-" .. isa)
            set_kind("static")
            set_default(false) -- linked into the shared libraries, never installed alone
            add_files("../src/ops/*/cpu/*_simd.cc", "../src/devices/cpu/*_simd.cc")
            add_defines("CPU_ISA=" .. isa)
            if #flags > 0 then add_cxflags(flags, {force = true}) end
            if isa == "avx2" then
                -- GCC's generic tuning copies and zeroes aggregates 16 bytes at a time; the AVX2 build's 16-lane
                -- vectors (two 256-bit halves, simd.h) are such aggregates, so a copy stored xmm pieces that the
                -- next ymm load could not forward from. Not forced: a compiler without the option drops it.
                add_cxflags("-mtune-ctrl=avx256_move_by_pieces,avx256_store_by_pieces")
            end
            add_cxflags("-Wno-psabi") -- vector arguments only cross internal, inlined helpers
            add_cxflags("-Wno-maybe-uninitialized") -- GCC 12 false positive inside _mm512_undefined_ps
            if has_config("sanitize") then
                -- ASan's checks as calls, not inline code: inlined into the passes' per-vector code they made
                -- GCC 12 take over 18 minutes for LayerNorm's AVX2 file (9.5 with them as calls), the same checks.
                -- Three checks are left out of these leaf kernels alone, for what they cost to compile there
                -- (LayerNorm backward's F32 AVX2 file: 227 s with them, 68 s without, 27 s uninstrumented):
                -- use-after-scope (85 -> 35 s of ASan's share; the kernels keep no pointer to a local past its
                -- block), pointer-overflow (address wraparound, not out-of-bounds: ASan checks every access)
                -- and null (ASan reports a null access as a SEGV with its stack). The 40 compiles of these files
                -- were most of the instrumented build, which took 50 of CI's 90 minutes on a slow day.
                add_cxflags("--param=asan-instrumentation-with-call-threshold=0", "-fno-sanitize-address-use-after-scope",
                            "-fno-sanitize=pointer-overflow,null", {force = true})
            end
        target_end()
    end

    target("infinirt-cpu")
        set_kind("static")
        set_default(false)
        add_files("../src/runtime/cpu/*.cc")
    target_end()

    target("infiniop-cpu")
        set_kind("static")
        set_default(false)
        add_files("../src/ops/*/cpu/*.cc|*/cpu/*_simd.cc", "../src/devices/cpu/*.cc|*_simd.cc")
        for isa, _ in pairs(isa_flags) do add_deps("infiniop-cpu-" .. isa) end
        add_defines("ENABLE_CPU_API")
        if multi_isa then add_defines("INFINI_CPU_MULTI_ISA") end
        -- sqrt need not set errno (nothing reads it): GCC then vectorizes BatchNorm's per-channel square roots.
        add_cxflags("-fno-math-errno")
        if has_config("omp") then
            add_cxflags("-fopenmp")
            add_defines("ENABLE_OMP")
        end
    target_end()
end
