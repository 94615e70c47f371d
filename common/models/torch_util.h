// Glue between specwire's plain types and libtorch: dtypes, zero-copy views of mapped tensors,
// devices, and the conversion of c10::Error into absl::Status at the edge.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/safetensors.h"

namespace specwire {

at::ScalarType ToScalarType(DType d);
absl::StatusOr<DType> FromScalarType(at::ScalarType t);
// "float32" / "bfloat16" / "float16" (also "fp32", "bf16", "fp16").
absl::StatusOr<at::ScalarType> ParseComputeDtype(absl::string_view name);
std::string ScalarTypeName(at::ScalarType t);  // "float32", "bfloat16", "float16"

// A tensor over the mapped bytes of `v`, without copying. The caller keeps the mapping alive and
// must not write through it (the mapping is read-only; a write faults).
at::Tensor WrapView(const TensorView& v);

// "cpu", "cuda", "cuda:1". INVALID_ARGUMENT for anything else, or FAILED_PRECONDITION when a CUDA
// device is requested from a build or host without CUDA.
absl::StatusOr<at::Device> ParseDevice(absl::string_view name);
bool CudaAvailable();
void SynchronizeDevice(const at::Device& d);

// A host tensor on `device` without making the host wait for the device: on a GPU the bytes go
// through pinned memory with an asynchronous copy (a plain .to() from pageable memory blocks the
// host until the device has finished all queued work: a stall per call in a forward that copies
// token ids or position tables); elsewhere a plain .to().
at::Tensor ToDeviceAsync(const at::Tensor& host, const at::Device& device);

// Runs `fn`, turning a c10::Error (or std::exception) it throws into INTERNAL (or
// RESOURCE_EXHAUSTED for out-of-memory) with `what` as context.
absl::Status RunGuarded(absl::string_view what, const std::function<absl::Status()>& fn);

}  // namespace specwire
