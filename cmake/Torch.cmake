# libtorch from the PyPI `torch` wheel, without the wheel's TorchConfig.cmake.
#
# Why not find_package(Torch): the wheel is a CUDA build, and its config insists on locating a CUDA
# toolkit matching the one torch was built with, even for CPU-only use. We only need headers and
# the shared libraries, so we describe them directly. SPECWIRE_CUDA=ON additionally links the CUDA
# backend (libtorch_cuda registers itself at load time, hence --no-as-needed).
#
# Result: the INTERFACE target `specwire_torch`.

set(SPECWIRE_TORCH_DIR "" CACHE PATH "Directory of the torch Python package (site-packages/torch)")
if(NOT SPECWIRE_TORCH_DIR)
  find_package(Python3 COMPONENTS Interpreter REQUIRED)
  execute_process(
    COMMAND ${Python3_EXECUTABLE} -c "import os, torch; print(os.path.dirname(torch.__file__))"
    OUTPUT_VARIABLE SPECWIRE_TORCH_DIR OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE _torch_rc)
  if(NOT _torch_rc EQUAL 0)
    message(FATAL_ERROR "torch not importable by ${Python3_EXECUTABLE}; pass -DSPECWIRE_TORCH_DIR=")
  endif()
endif()
if(NOT EXISTS "${SPECWIRE_TORCH_DIR}/include/ATen/ATen.h")
  message(FATAL_ERROR "SPECWIRE_TORCH_DIR=${SPECWIRE_TORCH_DIR} holds no libtorch headers")
endif()
message(STATUS "libtorch: ${SPECWIRE_TORCH_DIR}")

set(_tlib "${SPECWIRE_TORCH_DIR}/lib")
add_library(specwire_torch INTERFACE)
target_include_directories(specwire_torch SYSTEM INTERFACE
  "${SPECWIRE_TORCH_DIR}/include" "${SPECWIRE_TORCH_DIR}/include/torch/csrc/api/include")
target_compile_definitions(specwire_torch INTERFACE _GLIBCXX_USE_CXX11_ABI=1 C10_NODEPRECATED)
# The wheel's libraries find their CUDA runtime dependencies through their own RPATH; the linker
# needs to see them too when it checks transitive symbols.
file(GLOB _nvidia_libdirs "${SPECWIRE_TORCH_DIR}/../nvidia/*/lib")
set(_rpath_link "")
foreach(d ${_nvidia_libdirs})
  string(APPEND _rpath_link ",-rpath-link,${d}")
endforeach()
target_link_options(specwire_torch INTERFACE "LINKER:-rpath,${_tlib}${_rpath_link}")
if(SPECWIRE_CUDA)
  target_link_libraries(specwire_torch INTERFACE
    "-Wl,--no-as-needed" "${_tlib}/libtorch_cuda.so" "${_tlib}/libc10_cuda.so" "-Wl,--as-needed")
  target_compile_definitions(specwire_torch INTERFACE SPECWIRE_WITH_CUDA=1)
endif()
target_link_libraries(specwire_torch INTERFACE "${_tlib}/libtorch_cpu.so" "${_tlib}/libc10.so")
