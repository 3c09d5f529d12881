-- Which backends this configuration builds, as target names and compile definitions.

function infini_runtime_backends()
    local names = {}
    if has_config("cpu") then table.insert(names, "infinirt-cpu") end
    if has_config("nv-gpu", "nv-emulation") then table.insert(names, "infinirt-nvidia") end
    if has_config("ascend-npu") then table.insert(names, "infinirt-ascend") end
    return table.unpack(names)
end

function infini_op_backends()
    local names = {}
    if has_config("cpu") then table.insert(names, "infiniop-cpu") end
    if has_config("nv-gpu", "nv-emulation") then table.insert(names, "infiniop-nvidia") end
    if has_config("ascend-npu") then table.insert(names, "infiniop-ascend") end
    return table.unpack(names)
end

-- Called inside a target: the ENABLE_*_API macros tell the dispatch code which backends exist.
function add_runtime_defines()
    if has_config("cpu") then add_defines("ENABLE_CPU_API") end
    if has_config("nv-gpu", "nv-emulation") then add_defines("ENABLE_NVIDIA_API") end
    -- Each shared library keeps what its static backends hold (the static CUDA runtime, the std templates
    -- the backends instantiate) to itself, never exporting or interposing it.
    add_shflags("-Wl,--exclude-libs,ALL")
    if has_config("ascend-npu") then add_defines("ENABLE_ASCEND_API") end
    if has_config("omp") then
        add_shflags("-fopenmp")
    end
end
