// The vector conversions of the ISA this file is compiled for, against the scalar ones. simd::load (BF16 / F16
// -> F32, 16 lanes) against cpu::toFloat on every 16-bit pattern. simd::narrowBits (F32 -> BF16 / F16 bits)
// against cpu::fromFloat on every F32 sign / exponent / top-mantissa pattern joined with the low 16 bits that decide
// the rounding: ties, just above and below them, and NaN payloads that live only in those bits (which must
// stay NaNs, not round to infinity), also as the one such lane of a vector. Compiled by
// tests/test_vector_conversions.py with CPU_ISA and the flags native/xmake/cpu.lua gives that ISA. AVX512-BF16's
// conversion treats F32 subnormal inputs as zero, a property of the instruction (README, Numerics): for it a signed
// zero is expected there.
#include "devices/cpu/simd.h"

#include <cstdio>

namespace {

constexpr uint32_t kLowBits[] = {0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xbfff, 0xc000, 0xffff};
constexpr size_t kLows = sizeof kLowBits / sizeof kLowBits[0];
static_assert(simd::kWidth % kLows == 0, "a vector holds whole groups of low bits");

bool isSubnormal(uint32_t bits) { return (bits & 0x7f800000u) == 0 && (bits & 0x007fffffu) != 0; }

bool sameFloat(float a, float b) {
    uint32_t a_bits, b_bits;
    std::memcpy(&a_bits, &a, sizeof a);
    std::memcpy(&b_bits, &b, sizeof b);
    return a_bits == b_bits || (a != a && b != b && (a_bits >> 31) == (b_bits >> 31)); // a NaN may be quieted
}

template <typename T>
size_t wideningMismatches(const char *name) {
    size_t count = 0;
    for (uint32_t first = 0; first < 0x10000; first += simd::kWidth) {
        T stored[simd::kWidth];
        for (size_t lane = 0; lane < simd::kWidth; ++lane) stored[lane].bits = static_cast<uint16_t>(first + lane);
        float widened[simd::kWidth];
        simd::store(widened, simd::load(stored));
        for (size_t lane = 0; lane < simd::kWidth; ++lane) {
            const float expected = cpu::toFloat(stored[lane]);
            if (!sameFloat(widened[lane], expected)) {
                if (count < 8)
                    std::printf("%s: 0x%04x -> %a, scalar %a\n", name, stored[lane].bits, widened[lane], expected);
                ++count;
            }
        }
    }
    return count;
}

template <typename T>
size_t narrowingMismatches(const char *name, bool subnormal_inputs_are_zero) {
    constexpr uint32_t kHighsPerVector = simd::kWidth / kLows;
    size_t count = 0;
    for (uint32_t high = 0; high < 0x10000; high += kHighsPerVector) {
        uint32_t bits[simd::kWidth];
        float values[simd::kWidth];
        for (size_t lane = 0; lane < simd::kWidth; ++lane) {
            bits[lane] = (high + static_cast<uint32_t>(lane / kLows)) << 16 | kLowBits[lane % kLows];
            std::memcpy(&values[lane], &bits[lane], sizeof(float));
        }
        const simd::u16v narrowed = simd::narrowBits(simd::load(values), T{});
        for (size_t lane = 0; lane < simd::kWidth; ++lane) {
            uint16_t expected = cpu::fromFloat<T>(values[lane]).bits;
            if (subnormal_inputs_are_zero && isSubnormal(bits[lane])) expected = static_cast<uint16_t>(bits[lane] >> 16 & 0x8000u);
            if (narrowed[lane] != expected) {
                if (count < 8) std::printf("%s: 0x%08x -> 0x%04x, scalar 0x%04x\n", name, bits[lane], narrowed[lane], expected);
                ++count;
            }
        }
    }
    return count;
}

// A vector of finite values with one infinite or NaN lane, at each lane in turn: a path that tests vectors for
// NaNs before it rounds them must find one in either half, in any lane.
template <typename T>
size_t oneLaneMismatches(const char *name) {
    size_t count = 0;
    for (uint32_t sign : {0x0000u, 0x8000u}) {
        for (uint32_t high = 0x7f80; high < 0x8000; ++high) {
            for (uint32_t low : kLowBits) {
                for (size_t special = 0; special < simd::kWidth; ++special) {
                    float values[simd::kWidth];
                    for (size_t lane = 0; lane < simd::kWidth; ++lane) values[lane] = 1.5f + static_cast<float>(lane);
                    const uint32_t bits = (sign | high) << 16 | low;
                    std::memcpy(&values[special], &bits, sizeof(float));
                    const simd::u16v narrowed = simd::narrowBits(simd::load(values), T{});
                    for (size_t lane = 0; lane < simd::kWidth; ++lane) {
                        const uint16_t expected = cpu::fromFloat<T>(values[lane]).bits;
                        if (narrowed[lane] != expected) {
                            if (count < 8)
                                std::printf("%s: 0x%08x in lane %zu, lane %zu -> 0x%04x, scalar 0x%04x\n", name, bits,
                                            special, lane, narrowed[lane], expected);
                            ++count;
                        }
                    }
                }
            }
        }
    }
    return count;
}

} // namespace

int main() {
#if defined(__AVX512BF16__)
    const bool bf16_subnormals_are_zero = true;
#else
    const bool bf16_subnormals_are_zero = false;
#endif
    const size_t widening = wideningMismatches<cpu::bf16_t>("bf16") + wideningMismatches<cpu::f16_t>("f16");
    std::printf("%zu widening mismatches in 65536 values per dtype\n", widening);
    const size_t narrowing = narrowingMismatches<cpu::bf16_t>("bf16", bf16_subnormals_are_zero) +
                             narrowingMismatches<cpu::f16_t>("f16", false);
    std::printf("%zu narrowing mismatches in %u values per dtype\n", narrowing,
                0x10000u * static_cast<unsigned>(kLows));
    const size_t one_lane = oneLaneMismatches<cpu::bf16_t>("bf16") + oneLaneMismatches<cpu::f16_t>("f16");
    std::printf("%zu narrowing mismatches with one infinite or NaN lane among finite ones\n", one_lane);
    return widening == 0 && narrowing == 0 && one_lane == 0 ? 0 : 1;
}
