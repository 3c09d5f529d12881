-- Ascend backend: needs no CANN at build time (its libraries are dlopen'ed at run time), so it is on by default.
-- The loader and plan code under devices/ascend is compiled into both static libraries.
if has_config("ascend-npu") then
    target("infinirt-ascend")
        set_kind("static")
        set_default(false) -- linked into the shared libraries, never installed alone
        add_files("../src/runtime/ascend/*.cc", "../src/devices/ascend/*.cc")
        add_defines("ENABLE_ASCEND_API")
        add_syslinks("dl", {public = true})
    target_end()

    target("infiniop-ascend")
        set_kind("static")
        set_default(false) -- linked into the shared libraries, never installed alone
        add_files("../src/ops/*/ascend/*.cc", "../src/devices/ascend/*.cc")
        add_defines("ENABLE_ASCEND_API")
        add_syslinks("dl", {public = true})
    target_end()
end
