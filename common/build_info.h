// What this build is: specwire's version and the commit it was built from (cmake/WriteCommit.cmake
// writes the commit at every build, only when it changed; "" without git or $SPECWIRE_COMMIT).
#pragma once

#include <string>

namespace specwire {

std::string SpecwireVersion();
std::string SpecwireCommit();

}  // namespace specwire
