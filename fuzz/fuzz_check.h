// What every fuzz target shares: a check that reports and aborts (libFuzzer then saves the input),
// and the folder of fixed inputs (tokenizer files) the targets load once.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/status/status.h"

// An invariant of the code under test. A failure is a finding, like a sanitizer report.
#define FUZZ_CHECK(cond, ...)                                                            \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                                 \
      std::fprintf(stderr, "\n");                                                        \
      std::abort();                                                                      \
    }                                                                                    \
  } while (0)

namespace specwire::fuzz {

// fuzz/data, compiled in by fuzz/CMakeLists.txt; SPECWIRE_FUZZ_DATA overrides it.
inline std::string DataPath(const std::string& name) {
  const char* dir = std::getenv("SPECWIRE_FUZZ_DATA");
  return std::string(dir != nullptr ? dir : SPECWIRE_FUZZ_DATA_DIR) + "/" + name;
}

inline std::string ReadFileOrDie(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "cannot read %s\n", path.c_str());
    std::abort();
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// An error must carry a code and a message that says what is wrong.
inline void CheckError(const absl::Status& s) {
  FUZZ_CHECK(!s.ok(), "expected an error");
  FUZZ_CHECK(!s.message().empty(), "error %d without a message", static_cast<int>(s.code()));
}

}  // namespace specwire::fuzz
