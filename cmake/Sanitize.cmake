# Sanitizer and fuzzing builds (scripts/sanitize.sh, scripts/fuzz.sh).
#
# SPECWIRE_SANITIZE: every translation unit with AddressSanitizer + UndefinedBehaviorSanitizer,
# stopping at the first report (-fno-sanitize-recover), frame pointers kept for the stack traces.
# SPECWIRE_FUZZ (clang only; implies SPECWIRE_SANITIZE): the libFuzzer targets in fuzz/, with the
# libraries under test compiled with coverage feedback (-fsanitize=fuzzer-no-link). The same
# libraries still link into plain executables, so one build serves both the fuzzers and the
# sanitized unit tests.
if(SPECWIRE_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "SPECWIRE_FUZZ needs clang (libFuzzer): configure with CXX=clang++-14")
  endif()
  set(SPECWIRE_SANITIZE ON)
endif()
if(SPECWIRE_SANITIZE)
  add_compile_options(-fsanitize=address,undefined -fno-sanitize-recover=all
                      -fno-omit-frame-pointer -g1)
  add_link_options(-fsanitize=address,undefined -fno-sanitize-recover=all)
endif()
if(SPECWIRE_FUZZ)
  add_compile_options(-fsanitize=fuzzer-no-link)
endif()
