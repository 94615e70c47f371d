// How the extraction engine lays out several sequences in its forwards (plain types: the
// services' flag parsing and the engine share them).
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace specwire {

// How Extract lays out several sequences.
enum class BatchLayout {
  // The sequences packed one after another, without padding, into forwards of up to
  // kPackedRows tokens: the matrix products run once over every sequence's rows (on
  // DecoderModel::InvariantRows rows, where a row's rounding does not depend on the row count),
  // attention and the recurrences per sequence. On the CPU a sequence's hidden states are
  // bit-identical whatever else shares the request or the batch (fp32 and bf16): the canonical
  // extraction path and the CPU's default. On CUDA they are not (cuBLAS chooses its kernel by
  // the row count; measured on an H200: 0 of 962 Qwen3-8B-shaped fp32 taps identical).
  kPacked,
  // Each sequence runs through its own forward, unpadded: bit-identical whatever shares the batch
  // by construction (no row is ever shared), at the cost of one smaller forward per sequence.
  // The default on CUDA.
  kPerSequence,
  // Right-padded forwards over groups of similar length (padding at most doubles a group's
  // tokens): a sequence's low bits depend on what else is in the batch (bf16: up to ~1e-2
  // relative). For throughput comparisons.
  kPadded,
};

// Tokens one packed forward holds at most by default (a longer sequence runs alone).
inline constexpr int64_t kPackedRows = 2048;

// "packed" | "per_sequence" | "padded" ("auto" is the engine's: ExtractionEngine::
// SetBatchLayout); INVALID_ARGUMENT names `field`.
absl::StatusOr<BatchLayout> ParseBatchLayout(absl::string_view name, absl::string_view field);
// The help of --batch_layout, one text for every binary that takes the flag.
inline constexpr char kBatchLayoutFlagHelp[] =
    "How Extract lays out several sequences: auto (packed on the CPU, per_sequence on a GPU: the "
    "batch-invariant layout of each), packed (one forward over every sequence's rows; "
    "batch-invariant on the CPU, not on CUDA, where cuBLAS picks its kernel by the row count), "
    "per_sequence (a forward per sequence: batch-invariant everywhere) or padded (right-padded "
    "groups; for throughput comparisons). The contract's kernel_variant names the layout.";
const char* BatchLayoutName(BatchLayout layout);

}  // namespace specwire
