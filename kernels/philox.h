// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
// SC'11): a counter-based generator, so element i's random number depends only
// on (seed, i) and CPU and GPU draw the same stream without sharing state.
// Host and device code share this header.
#ifndef KEEL_KERNELS_PHILOX_H_
#define KEEL_KERNELS_PHILOX_H_

#include <cstdint>

#if defined(__CUDACC__)
#define KEEL_HD __host__ __device__ __forceinline__
#else
#define KEEL_HD inline
#endif

namespace keel {

struct Philox4 {
  uint32_t v[4];
};

KEEL_HD void PhiloxMulHiLo(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
  uint64_t product = static_cast<uint64_t>(a) * static_cast<uint64_t>(b);
  *hi = static_cast<uint32_t>(product >> 32);
  *lo = static_cast<uint32_t>(product);
}

// Ten rounds over counter (c0..c3) with key (k0, k1).
KEEL_HD Philox4 Philox4x32(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                           uint32_t k1) {
  const uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  const uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    PhiloxMulHiLo(kMul0, c0, &hi0, &lo0);
    PhiloxMulHiLo(kMul1, c2, &hi1, &lo1);
    uint32_t n0 = hi1 ^ c1 ^ k0;
    uint32_t n1 = lo1;
    uint32_t n2 = hi0 ^ c3 ^ k1;
    uint32_t n3 = lo0;
    c0 = n0; c1 = n1; c2 = n2; c3 = n3;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return Philox4{{c0, c1, c2, c3}};
}

// The uniform in [0, 1) used to round element `index` of a tensor: 24 random
// bits, so the float is exact and CPU and GPU compare it identically. Counter
// (index / 4 low, index / 4 high, 0, 0), lane index % 4.
KEEL_HD float PhiloxUniform(uint64_t seed, uint64_t index) {
  uint64_t group = index >> 2;
  Philox4 r = Philox4x32(static_cast<uint32_t>(group), static_cast<uint32_t>(group >> 32), 0u,
                         0u, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  uint32_t bits = r.v[index & 3];
  return static_cast<float>(bits >> 8) * (1.0f / 16777216.0f);
}

}  // namespace keel

#endif  // KEEL_KERNELS_PHILOX_H_
