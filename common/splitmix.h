// SplitMix64 (Steele, Lea and Flood): the step of the generator from state `x` (x plus the
// golden-ratio increment, then the finaliser). Used as a counter-based hash of `x`, and as a
// generator by adding kSplitMixIncrement to the state between calls.
#pragma once

#include <cstdint>

namespace specwire {

inline constexpr uint64_t kSplitMixIncrement = 0x9e3779b97f4a7c15ull;

inline uint64_t SplitMix64(uint64_t x) {
  uint64_t z = x + kSplitMixIncrement;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace specwire
