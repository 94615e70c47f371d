// Error propagation helpers around absl::Status / absl::StatusOr.
//
// Every function that can fail on user input (a file, a config, a request) returns a Status or
// StatusOr; aborting is reserved for broken internal invariants.
#pragma once

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

#define SW_CONCAT_INNER_(a, b) a##b
#define SW_CONCAT_(a, b) SW_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (a Status) is not OK.
#define SW_RETURN_IF_ERROR(expr)                  \
  do {                                            \
    ::absl::Status sw_status_ = (expr);           \
    if (!sw_status_.ok()) return sw_status_;      \
  } while (0)

// `SW_ASSIGN_OR_RETURN(auto x, MakeX());` unwraps a StatusOr or returns its error.
#define SW_ASSIGN_OR_RETURN(lhs, rexpr) \
  SW_ASSIGN_OR_RETURN_IMPL_(SW_CONCAT_(sw_statusor_, __COUNTER__), lhs, rexpr)
#define SW_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                              \
  if (!tmp.ok()) return std::move(tmp).status();   \
  lhs = std::move(tmp).value()

namespace specwire {

// Prefixes an error with context ("loading shard x: ...") and keeps its code.
inline absl::Status Annotate(const absl::Status& s, absl::string_view context) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(context, ": ", s.message()));
}

}  // namespace specwire
