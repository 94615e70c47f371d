// gtest helpers for statuses (tests only).
#pragma once

#include <initializer_list>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"

namespace specwire {

// `s` has `code` and its message contains every one of `parts` (file, key, value...).
inline void ExpectError(const absl::Status& s, absl::StatusCode code,
                        std::initializer_list<absl::string_view> parts) {
  EXPECT_EQ(s.code(), code) << s;
  for (absl::string_view part : parts) {
    EXPECT_TRUE(absl::StrContains(s.message(), part)) << "\"" << part << "\" not in: " << s;
  }
}

}  // namespace specwire
