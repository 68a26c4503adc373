// The one 64-bit mixer (splitmix64) and a small deterministic random
// generator (xoshiro256**, seeded through splitmix64) with the few
// distributions the dataset generators need.
// Everything is computed here rather than with <random>'s distributions,
// whose output is implementation-defined, so a seed names the same dataset
// on every standard library.
#ifndef TUTTI_COMMON_RNG_H_
#define TUTTI_COMMON_RNG_H_

#include <cmath>
#include <cstdint>

namespace tutti {

inline constexpr uint64_t kGoldenGamma = 0x9E3779B97F4A7C15ull;  // 2^64 / golden ratio

// splitmix64's finaliser: a bijective, well-mixed 64-bit hash.
inline uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// splitmix64 step: a good 64-bit mixer for deriving independent seeds.
inline uint64_t SplitMix64(uint64_t& state) { return Mix64(state += kGoldenGamma); }

// The splitmix64 output of state x (one step from x): a keyed hash.
inline uint64_t SplitMix64Of(uint64_t x) { return Mix64(x + kGoldenGamma); }

// A seed for stream `b` of master seed `a` (e.g. sample index b of seed a).
inline uint64_t MixSeed(uint64_t a, uint64_t b) {
  uint64_t s = a ^ (b * 0xD1B54A32D192ED03ull);
  SplitMix64(s);
  return SplitMix64(s);
}

class Rng {
 public:
  explicit Rng(uint64_t seed) {
    for (auto& w : s_) w = SplitMix64(seed);
  }

  uint64_t Next() {
    const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }

  // Uniform in [0, 1) with 53 random bits.
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  double Uniform(double lo, double hi) { return lo + (hi - lo) * Uniform(); }
  // Uniform integer in [0, n); n > 0. Multiply-shift (bias < 2^-64 * n).
  uint64_t Below(uint64_t n) {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(Next()) * n) >> 64);
  }
  // Uniform integer in [lo, hi].
  int64_t Between(int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(Below(static_cast<uint64_t>(hi - lo) + 1));
  }
  bool Bernoulli(double p) { return Uniform() < p; }
  // Standard normal (Box-Muller; one value per call).
  double Normal() {
    const double u1 = 1.0 - Uniform();  // (0, 1]
    const double u2 = Uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  // Log-normal with the given median and log-space sigma.
  double LogNormal(double median, double sigma) { return median * std::exp(sigma * Normal()); }
  // Log-uniform in [lo, hi] (lo > 0).
  double LogUniform(double lo, double hi) { return std::exp(Uniform(std::log(lo), std::log(hi))); }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

}  // namespace tutti

#endif  // TUTTI_COMMON_RNG_H_
