#include "services/scorer/drafters/vocab_map.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace specwire {
namespace {

std::string Shape(const std::vector<int64_t>& s) {
  return absl::StrCat("[", absl::StrJoin(s, ", "), "]");
}

}  // namespace

absl::StatusOr<std::vector<int64_t>> ReadDraftVocabulary(const Checkpoint& checkpoint,
                                                         const std::string& dir, int64_t Vd,
                                                         int64_t V,
                                                         std::set<std::string>& consumed) {
  std::vector<int64_t> out;
  const TensorView* d2t = checkpoint.Find("d2t");
  const TensorView* t2d = checkpoint.Find("t2d");
  if ((d2t == nullptr) != (t2d == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": tensor \"", d2t ? "t2d" : "d2t",
                                                   "\" is missing (d2t and t2d come together)"));
  }
  if (d2t == nullptr && Vd != V) {
    return absl::InvalidArgumentError(absl::StrCat(
        dir, ": draft_vocab_size ", Vd, " < vocab_size ", V, " but the checkpoint has no "
        "\"d2t\" / \"t2d\" vocabulary maps"));
  }
  out.resize(Vd);
  for (int64_t i = 0; i < Vd; ++i) out[i] = i;
  if (d2t != nullptr) {
    if (d2t->dtype != DType::kI64 || d2t->shape != std::vector<int64_t>{Vd}) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"d2t\" is ", DTypeName(d2t->dtype),
                                                     " ", Shape(d2t->shape), "; expected I64 [",
                                                     Vd, "] (draft_vocab_size)"));
    }
    if (t2d->dtype != DType::kBool || t2d->shape != std::vector<int64_t>{V}) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"t2d\" is ", DTypeName(t2d->dtype),
                                                     " ", Shape(t2d->shape), "; expected BOOL [",
                                                     V, "] (vocab_size)"));
    }
    const int64_t* off = reinterpret_cast<const int64_t*>(d2t->data);
    const uint8_t* mask = reinterpret_cast<const uint8_t*>(t2d->data);
    int64_t prev = -1;
    for (int64_t i = 0; i < Vd; ++i) {
      const int64_t t = i + off[i];
      if (t < 0 || t >= V) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor \"d2t\": entry ", i, " maps draft id ", i, " to target id ", t,
            ", outside the target vocabulary [0, ", V, ")"));
      }
      if (t <= prev) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor \"d2t\": draft ids ", i - 1, " and ", i, " map to target ids ", prev,
            " and ", t, "; the draft vocabulary lists target ids in ascending order"));
      }
      if (!mask[t]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensors \"d2t\" and \"t2d\" disagree: draft id ", i, " maps to target id ", t,
            ", which t2d leaves out"));
      }
      out[i] = t;
      prev = t;
    }
    int64_t kept = 0;
    for (int64_t t = 0; t < V; ++t) kept += mask[t] ? 1 : 0;
    if (kept != Vd) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"t2d\" keeps ", kept,
                                                     " target ids; draft_vocab_size is ", Vd));
    }
    consumed.insert("d2t");
    consumed.insert("t2d");
  }
  return out;
}

}  // namespace specwire
