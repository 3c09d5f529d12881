-- CPU backend: runtime and operator kernels, each a static library linked into the shared ones.
if has_config("cpu") then
    target("infinirt-cpu")
        set_kind("static")
        set_default(false) -- linked into the shared libraries, never installed alone
        add_files("../src/runtime/cpu/*.cc")
    target_end()

    target("infiniop-cpu")
        set_kind("static")
        set_default(false) -- linked into the shared libraries, never installed alone
        add_files("../src/ops/*/cpu/*.cc")
        add_defines("ENABLE_CPU_API")
        if has_config("omp") then
            add_cxflags("-fopenmp")
            add_defines("ENABLE_OMP")
        end
    target_end()
end
