#include "common/build_info.h"

#include "specwire_commit.h"

namespace specwire {

std::string SpecwireVersion() { return SPECWIRE_VERSION; }
std::string SpecwireCommit() { return SPECWIRE_COMMIT; }

}  // namespace specwire
