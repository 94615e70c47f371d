// torch.save's file format, written without libtorch: a stored (uncompressed) zip whose
// `archive/data.pkl` is a protocol-2 pickle of a dict {name: tensor} built with
// torch._utils._rebuild_tensor_v2 over persistent storages `archive/data/{i}`, each record
// 64-byte aligned as torch's own writer does, so torch.load reads it (mmap=True too). Checked
// against torch.load in the export tests. Keeps specwire-cli (the containers' health probe)
// free of libtorch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/safetensors.h"

namespace specwire {

struct SavedTensor {
  std::string name;
  DType dtype;                 // kBF16, kF16, kF32 or kI64
  std::vector<int64_t> shape;  // contiguous, row-major
  std::string bytes;           // little-endian, numel × DTypeSize(dtype)
};

// The bytes of torch.save({t.name: t for t in tensors}) (insertion order kept).
std::string TorchSaveDict(const std::vector<SavedTensor>& tensors);

// CRC-32 (the zip / zlib polynomial).
uint32_t Crc32(const std::string& bytes);

}  // namespace specwire
