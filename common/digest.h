// Content digests for the extraction contract (weights, tokenizer).
//
// XXH3-128: not cryptographic — it identifies content, it does not authenticate it — but it runs
// near memory bandwidth, so digesting a 54 GB checkpoint costs seconds on top of reading it.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace specwire {

class ContentDigest {
 public:
  ContentDigest();
  ~ContentDigest();
  ContentDigest(const ContentDigest&) = delete;
  ContentDigest& operator=(const ContentDigest&) = delete;

  void Update(std::span<const std::byte> bytes);
  void Update(std::string_view s);
  // Length-prefixed, so ("ab","c") and ("a","bc") differ.
  void UpdateField(std::string_view s);
  // "xxh3-128:<32 hex digits>".
  std::string Hex() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Digest of one buffer, same format.
std::string DigestBytes(std::span<const std::byte> bytes);

}  // namespace specwire
