#include "common/models/torch_util.h"

#include <torch/cuda.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"

namespace specwire {

at::ScalarType ToScalarType(DType d) {
  switch (d) {
    case DType::kBF16: return at::kBFloat16;
    case DType::kF16: return at::kHalf;
    case DType::kF32: return at::kFloat;
    case DType::kI64: return at::kLong;
    case DType::kBool: return at::kBool;
  }
  return at::kFloat;
}

absl::StatusOr<DType> FromScalarType(at::ScalarType t) {
  switch (t) {
    case at::kBFloat16: return DType::kBF16;
    case at::kHalf: return DType::kF16;
    case at::kFloat: return DType::kF32;
    default:
      return absl::InvalidArgumentError(absl::StrCat("unsupported tensor dtype ", c10::toString(t)));
  }
}

absl::StatusOr<at::ScalarType> ParseComputeDtype(absl::string_view name) {
  if (name == "float32" || name == "fp32" || name == "f32") return at::kFloat;
  if (name == "bfloat16" || name == "bf16") return at::kBFloat16;
  if (name == "float16" || name == "fp16" || name == "f16") return at::kHalf;
  return absl::InvalidArgumentError(
      absl::StrCat("dtype \"", name, "\" is not one of float32, bfloat16, float16"));
}

std::string ScalarTypeName(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kBFloat16: return "bfloat16";
    case at::kHalf: return "float16";
    default: return c10::toString(t);
  }
}

at::Tensor WrapView(const TensorView& v) {
  // from_blob needs a non-const pointer; the tensor is only ever read (weights are converted or
  // used as-is by read-only ops).
  void* p = const_cast<std::byte*>(v.data);
  return at::from_blob(p, v.shape, at::TensorOptions().dtype(ToScalarType(v.dtype)));
}

bool CudaAvailable() {
#ifdef SPECWIRE_WITH_CUDA
  return torch::cuda::is_available();
#else
  return false;
#endif
}

absl::StatusOr<at::Device> ParseDevice(absl::string_view name) {
  if (name == "cpu") return at::Device(at::kCPU);
  if (name == "cuda" || absl::StartsWith(name, "cuda:")) {
    int index = 0;
    if (name.size() >= 5 && (!absl::SimpleAtoi(name.substr(5), &index) || index < 0)) {
      return absl::InvalidArgumentError(absl::StrCat("device \"", name, "\": bad CUDA index"));
    }
    if (!CudaAvailable()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "device \"", name, "\" requested but CUDA is not available (build with -DSPECWIRE_CUDA=ON "
          "against a CUDA libtorch, on a host with a GPU)"));
    }
#ifdef SPECWIRE_WITH_CUDA
    if (index < 0 || index >= torch::cuda::device_count()) {
      return absl::InvalidArgumentError(absl::StrCat("device \"", name, "\": only ",
                                                     torch::cuda::device_count(), " GPU(s)"));
    }
#endif
    return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(index));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("device \"", name, "\" is not one of cpu, cuda, cuda:N"));
}

void SynchronizeDevice(const at::Device& d) {
#ifdef SPECWIRE_WITH_CUDA
  if (d.is_cuda()) torch::cuda::synchronize(d.index());
#endif
}

at::Tensor ToDeviceAsync(const at::Tensor& host, const at::Device& device) {
  if (!device.is_cuda() || !host.device().is_cpu()) return host.to(device);
  // The pinned staging block returns to torch's host allocator only once the copy has run.
  return host.pin_memory().to(device, /*non_blocking=*/true);
}

absl::Status RunGuarded(absl::string_view what, const std::function<absl::Status()>& fn) {
  try {
    return fn();
  } catch (const c10::OutOfMemoryError& e) {
    return absl::ResourceExhaustedError(absl::StrCat(what, ": out of memory: ", e.what_without_backtrace()));
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat(what, ": ", e.what_without_backtrace()));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(what, ": out of host memory"));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(what, ": ", e.what()));
  }
}

}  // namespace specwire
