// safetensors files: a zero-copy reader (mmap) and a writer.
//
// Format: 8-byte little-endian header length N, then N bytes of JSON
//   {"__metadata__": {str: str}, "<name>": {"dtype": "BF16", "shape": [..], "data_offsets": [b, e]}}
// then the data section; offsets are relative to the data section's start.
//
// The reader validates everything before handing out a view: header length bound, JSON shape,
// dtype (BF16 / F16 / F32 / I64 / BOOL), shape × element size == byte length, offsets inside the file,
// tensors contiguous and non-overlapping (they must tile the data section without gaps, as
// every safetensors writer produces). Errors name the file, the tensor and the problem.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace specwire {

// Weights and states are floats (BF16 / F16 / F32); I64 and BOOL hold token ids and vocabulary
// maps (files specwire writes; an EAGLE-3 drafter's d2t / t2d). Readers of weights check
// IsFloat.
enum class DType { kBF16, kF16, kF32, kI64, kBool };

// "BF16" / "F16" / "F32" / "I64" / "BOOL".
const char* DTypeName(DType d);
size_t DTypeSize(DType d);
bool IsFloat(DType d);
// The dtypes a file may hold: BF16, F16, F32, I64, BOOL.
absl::StatusOr<DType> ParseDTypeName(std::string_view name);

// A tensor inside a mapped file. Non-owning: valid while the SafetensorsFile lives.
struct TensorView {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const std::byte* data = nullptr;  // points into the mapping
  size_t nbytes = 0;

  int64_t numel() const;
};

class SafetensorsFile {
 public:
  // Upper bound on the JSON header (safetensors itself uses 100 MB).
  static constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

  // Maps `path` read-only and validates its header. Errors: NOT_FOUND (no such file; other open
  // failures map from errno, e.g. PERMISSION_DENIED), DATA_LOSS (truncated: file under 8 bytes,
  // header or tensor data running past the end of the file), INVALID_ARGUMENT (anything else
  // malformed). Messages carry file + tensor + problem. Bytes after the last tensor are allowed.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Sorted by name.
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  // nullptr when absent.
  const TensorView* Find(const std::string& name) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* map_ = nullptr;  // owned mapping of the whole file
  size_t map_size_ = 0;
  std::map<std::string, std::string> metadata_;
  std::map<std::string, TensorView> tensors_;
};

// One tensor to write: bytes are row-major little-endian, exactly numel × DTypeSize(dtype).
struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::span<const std::byte> bytes;
};

// Writes a safetensors file (tensors sorted by name, header padded to 8 bytes with spaces) to
// `path` atomically (`path`.tmp.<pid> + fsync + rename). INVALID_ARGUMENT if a byte count does not
// match its shape, a name repeats, a name is "__metadata__" or a string is not valid UTF-8.
absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

}  // namespace specwire
