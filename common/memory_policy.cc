#include "common/memory_policy.h"

#include <cstdlib>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace specwire {

void KeepFreedMemoryForReuse() {
#if defined(__GLIBC__)
  struct Setting {
    int param;
    const char* env;
    int value;
  };
  const Setting settings[] = {
      // Blocks up to 32 MiB (glibc's upper bound for this setting) come from the heap.
      {M_MMAP_THRESHOLD, "MALLOC_MMAP_THRESHOLD_", 32 << 20},
      // The heap top is not returned to the kernel on free.
      {M_TRIM_THRESHOLD, "MALLOC_TRIM_THRESHOLD_", 1 << 30},
      // The heap grows in steps of 64 MiB (address space; pages count once touched).
      {M_TOP_PAD, "MALLOC_TOP_PAD_", 64 << 20},
  };
  for (const Setting& s : settings) {
    if (std::getenv(s.env) == nullptr) mallopt(s.param, s.value);
  }
#endif
}

}  // namespace specwire
