// Enum arguments arrive from C, where any int may be passed; in C++ reading an enum object whose value lies
// outside the enum's range is undefined, so the entry points validate the raw bits instead.
#ifndef INFINI_COMMON_ENUM_VALUE_H
#define INFINI_COMMON_ENUM_VALUE_H

#include <cstring>
#include <type_traits>

namespace infini {

template <typename Enum>
long long rawValue(const Enum &value) {
    std::underlying_type_t<Enum> raw;
    std::memcpy(&raw, &value, sizeof raw);
    return static_cast<long long>(raw);
}

} // namespace infini

#endif
