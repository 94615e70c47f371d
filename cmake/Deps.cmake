# Dependencies besides libtorch. The engine needs only absl (status), nlohmann-json and xxhash
# (header-only use). Hosts without Debian dev packages point SPECWIRE_DEPS_ROOT at a folder where
# the .deb files were unpacked with `dpkg -x` (see scripts/gpu_check.sh).
set(SPECWIRE_DEPS_ROOT "" CACHE PATH "Folder with unpacked .deb dependencies (dpkg -x)")
if(SPECWIRE_DEPS_ROOT)
  list(PREPEND CMAKE_PREFIX_PATH "${SPECWIRE_DEPS_ROOT}/usr"
       "${SPECWIRE_DEPS_ROOT}/usr/lib/x86_64-linux-gnu/cmake")
  include_directories(SYSTEM "${SPECWIRE_DEPS_ROOT}/usr/include")
endif()

find_package(absl REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_path(XXHASH_INCLUDE_DIR xxhash.h REQUIRED)

if(SPECWIRE_TESTS)
  find_package(GTest REQUIRED)
endif()

# The services: gRPC, protobuf, Prometheus (Debian packages).
if(NOT SPECWIRE_ENGINE_ONLY)
  find_package(Protobuf REQUIRED)
  find_package(gRPC CONFIG REQUIRED)
  find_program(GRPC_CPP_PLUGIN grpc_cpp_plugin REQUIRED)
  find_package(prometheus-cpp CONFIG REQUIRED)
endif()
