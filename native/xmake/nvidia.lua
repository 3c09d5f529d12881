-- NVIDIA CUDA backend: runtime and operator kernels, each a static library linked into the shared ones.
-- The CUDA runtime is linked statically (libcudart_static) and kept private to each shared library
-- (--exclude-libs in devices.lua), so a build with CUDA loads on machines with no driver at all.
if has_config("nv-gpu") then
    -- Include and link paths of the CUDA toolkit xmake finds (--cuda=DIR overrides); cudart_static and the
    -- system libraries it needs travel to the shared libraries that link these static ones.
    rule("infini.cuda.toolkit")
        on_load(function (target)
            import("detect.sdks.find_cuda")
            local cuda = find_cuda(get_config("cuda"))
            if not cuda then
                raise("nv-gpu: CUDA toolkit not found (install it or pass --cuda=DIR)")
            end
            target:add("includedirs", cuda.includedirs)
            target:add("linkdirs", cuda.linkdirs, {public = true})
            target:add("syslinks", "cudart_static", "rt", "pthread", "dl", {public = true})
        end)
        -- xmake's cuda rule adds the toolkit's lib dir as an rpath; the static runtime needs none.
        on_config(function (target)
            target:set("rpathdirs", nil)
        end)
    rule_end()

    target("infinirt-nvidia")
        set_kind("static")
        set_default(false) -- linked into the shared libraries, never installed alone
        add_rules("infini.cuda.toolkit")
        add_files("../src/runtime/nvidia/*.cc")
        add_defines("ENABLE_NVIDIA_API")
    target_end()

    target("infiniop-nvidia")
        set_kind("static")
        set_default(false) -- linked into the shared libraries, never installed alone
        add_rules("infini.cuda.toolkit")
        add_files("../src/ops/*/nvidia/*.cu")
        add_defines("ENABLE_NVIDIA_API")
        -- Kernels are whole-program per file: no relocatable device code, so no device-link step is needed.
        set_values("cuda.rdc", false)
        set_policy("build.cuda.devlink", false)
        add_cugencodes("sm_80", "sm_90", "compute_90")
        -- nvcc compiles the targets of one file one after the other unless told: LayerNorm's two (about 30 s of
        -- CPU each) were a CUDA build's last job, alone on one core of two. --threads 0: as many as the CPU has.
        add_cuflags("-Xcompiler=-fPIC", "-Xcompiler=-fvisibility=hidden", "-Xcompiler=-Wall",
                    "-Xcompiler=-Wextra", "-Xcompiler=-Wno-unused-parameter", "--Werror=all-warnings",
                    "-std=c++17", "--extended-lambda", "--threads", "0", {force = true})
    target_end()
end
