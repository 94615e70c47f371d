// Which kernels a target's forward runs (--kernels). Two sets, one choice for the whole model:
//   reference  the libtorch ops transformers calls on the same tensors: at::linear (MKL in fp32,
//              oneDNN in bf16) and scaled_dot_product_attention. Where specwire's shapes are
//              transformers' too (the Qwen3.5 hybrid; bf16 single sequences of the dense
//              families), the states are transformers' bit for bit.
//   fast       specwire's CPU kernels: linear layers multiplied by oneDNN on weights reordered
//              once at load (common/models/linear.h) and CpuFlashAttention
//              (common/models/flash_attention.h). Within rounding of reference, not bit-identical
//              in fp32; what this machine's numbers are is in the README.
// Either way a sequence's states do not depend on what shares its batch.
#pragma once

#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace specwire {

enum class KernelSet { kReference, kFast };

// --kernels: "auto" (nullopt: the family's default, ResolveKernelSet in loader.h), "reference" or
// "fast". INVALID_ARGUMENT naming `flag`, the value and the choices otherwise.
absl::StatusOr<std::optional<KernelSet>> ParseKernelSet(absl::string_view value,
                                                        absl::string_view flag);
const char* KernelSetName(KernelSet set);  // "reference" | "fast"

// The help of --kernels, one text for every binary that takes the flag.
inline constexpr char kKernelsFlagHelp[] =
    "The target's kernels: auto (each family's default: reference for the Qwen3.5 hybrid, "
    "bit-identical to transformers on the CPU; fast for Llama/Qwen2/Qwen3), reference (the "
    "libtorch ops transformers calls: at::linear, scaled_dot_product_attention) or fast "
    "(oneDNN products on weights reordered at load, specwire's AVX-512 attention: within "
    "rounding of reference). The contract's kernel_variant names what ran.";

}  // namespace specwire
