// SplitMix64 (Steele, Lea and Flood, 2014): a 64-bit generator whose stream is
// fixed by its seed on every machine and compiler (std::mt19937's stream is too,
// but std's distributions are not). Keel draws from it where a documented,
// reproducible order matters: the random axes of a sweep (server/sweep.cc) and
// the shuffled order of training batches (worker/io/token_loader.cc).
#ifndef KEEL_KERNELS_BASE_SPLITMIX64_H_
#define KEEL_KERNELS_BASE_SPLITMIX64_H_

#include <cstdint>

namespace keel {

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}

  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

  // Uniform in [0, 1): the top 53 bits as a double.
  double Uniform01() { return static_cast<double>(Next() >> 11) * (1.0 / 9007199254740992.0); }

  // Uniform in [0, n) for n >= 1, without modulo bias: draws that fall in the
  // short tail above the largest multiple of n are drawn again.
  uint64_t Below(uint64_t n) {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do {
      x = Next();
    } while (x >= limit);
    return x % n;
  }

 private:
  uint64_t state_;
};

}  // namespace keel

#endif  // KEEL_KERNELS_BASE_SPLITMIX64_H_
