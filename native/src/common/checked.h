// size_t arithmetic that remembers an overflow: workspace and byte-count sums of shapes whose extents are huge
// (an empty batch beside a broadcast parameter, or a descriptor made without memory behind it) must refuse the
// shape, not wrap around to a small size that every run then overruns.
#ifndef INFINI_COMMON_CHECKED_H
#define INFINI_COMMON_CHECKED_H

#include <cstddef>
#include <cstdint>

namespace infini {

class CheckedSize {
  public:
    CheckedSize(size_t value = 0) : value_(value) {} // NOLINT: implicit, so plain sizes mix in

    friend CheckedSize operator+(CheckedSize a, CheckedSize b) {
        CheckedSize sum(a.value_ + b.value_);
        sum.overflow_ = a.overflow_ || b.overflow_ || sum.value_ < a.value_;
        return sum;
    }
    friend CheckedSize operator*(CheckedSize a, CheckedSize b) {
        CheckedSize product(a.value_ * b.value_);
        product.overflow_ = a.overflow_ || b.overflow_ || (b.value_ != 0 && a.value_ > SIZE_MAX / b.value_);
        return product;
    }

    bool overflowed() const { return overflow_; }
    size_t value() const { return value_; } // meaningless once overflowed

  private:
    size_t value_;
    bool overflow_ = false;
};

} // namespace infini

#endif
