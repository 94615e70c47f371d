#include "common/digest.h"

#include <cstdint>
#include <cstdio>

#define XXH_INLINE_ALL
#include "xxhash.h"

namespace specwire {

struct ContentDigest::State {
  XXH3_state_t xxh;
};

ContentDigest::ContentDigest() : state_(std::make_unique<State>()) {
  XXH3_128bits_reset(&state_->xxh);
}
ContentDigest::~ContentDigest() = default;

void ContentDigest::Update(std::span<const std::byte> bytes) {
  XXH3_128bits_update(&state_->xxh, bytes.data(), bytes.size());
}
void ContentDigest::Update(std::string_view s) {
  XXH3_128bits_update(&state_->xxh, s.data(), s.size());
}
void ContentDigest::UpdateField(std::string_view s) {
  const uint64_t n = s.size();
  XXH3_128bits_update(&state_->xxh, &n, sizeof(n));
  Update(s);
}

std::string ContentDigest::Hex() const {
  const XXH128_hash_t h = XXH3_128bits_digest(&state_->xxh);
  char buf[64];
  std::snprintf(buf, sizeof(buf), "xxh3-128:%016llx%016llx",
                static_cast<unsigned long long>(h.high64), static_cast<unsigned long long>(h.low64));
  return buf;
}

std::string DigestBytes(std::span<const std::byte> bytes) {
  ContentDigest d;
  d.Update(bytes);
  return d.Hex();
}

}  // namespace specwire
