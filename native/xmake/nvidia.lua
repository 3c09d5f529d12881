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
        add_cugencodes(table.unpack(get_config("nv-arch"):split(",")))
        -- nvcc compiles the targets of one file one after the other unless told: LayerNorm's two (about 30 s of
        -- CPU each) were a CUDA build's last job, alone on one core of two. --threads 0: as many as the CPU has.
        add_cuflags("-Xcompiler=-fPIC", "-Xcompiler=-fvisibility=hidden", "-Xcompiler=-Wall",
                    "-Xcompiler=-Wextra", "-Xcompiler=-Wno-unused-parameter", "--Werror=all-warnings",
                    "-std=c++17", "--extended-lambda", "--threads", "0", {force = true})
    target_end()
end

-- The same backend as C++ for the CPU emulation of CUDA (tests/native/cuda_emulation, whose shim headers stand for
-- the toolkit's), so that every kernel runs and is tested on a machine without a GPU (.ci/sanitize). Only
-- the launch syntax is not C++: each .cu and .cuh is copied with `kernel<<<config>>>(arguments)` rewritten into
-- `::emu::launchCall([=] { kernel(arguments); }, config)`. The copies of the .cuh sit where the copied .cu files'
-- quoted includes find them first; the .cu files' own "../op.h" are found through their source folders.
if has_config("nv-emulation") then
    rule("infini.cuda.emulation")
        on_load(function (target)
            target:add("includedirs", path.join(os.projectdir(), "tests/native/cuda_emulation"))
            target:add("defines", "ENABLE_NVIDIA_API")
            target:add("cxxflags", "-Wno-unknown-pragmas") -- the kernels' #pragma unroll
            if has_config("sanitize") then
                -- As for the CPU leaf kernels (cpu.lua), and for the same reason: LayerNorm backward's file
                -- compiles in 207 s without these three checks, 344 s with them. ASan still checks every access.
                target:add("cxflags", "-fno-sanitize-address-use-after-scope", "-fno-sanitize=pointer-overflow,null")
            end
        end)
    rule_end()

    target("infinirt-nvidia")
        set_kind("static")
        set_default(false)
        add_rules("infini.cuda.emulation")
        add_files("../src/runtime/nvidia/*.cc")
    target_end()

    target("infiniop-nvidia")
        set_kind("static")
        set_default(false)
        add_rules("infini.cuda.emulation")
        on_load(function (target)
            local function emulated_launches(text)
                local function launch(kernel, config, arguments)
                    return "::emu::launchCall([=] { " .. kernel .. arguments .. "; }, " .. config .. ")"
                end
                text = text:gsub("([%w_:]+%b<>)<<<(.-)>>>(%b())", launch) -- kernel<template arguments>
                return (text:gsub("([%w_:]+)<<<(.-)>>>(%b())", launch))
            end
            local out = path.join(target:autogendir(), "nv-emulation")
            local function copy(source, to)
                local text = emulated_launches(io.readfile(source))
                if not os.isfile(to) or io.readfile(to) ~= text then io.writefile(to, text) end
            end
            for _, header in ipairs(os.files(path.join(os.projectdir(), "native/src/ops/*.cuh"))) do
                copy(header, path.join(out, "ops", path.filename(header)))
            end
            for _, source in ipairs(os.files(path.join(os.projectdir(), "native/src/ops/*/nvidia/*.cu"))) do
                local to = path.join(out, path.basename(source) .. ".cc")
                copy(source, to)
                target:add("files", to)
                target:add("includedirs", path.directory(source))
            end
        end)
    target_end()
end
