# Shared build settings; included by the root and by kernels/ when kernels/
# is configured on its own.
include_guard(GLOBAL)

find_program(CCACHE_PROGRAM ccache)
if(CCACHE_PROGRAM)
  set(CMAKE_C_COMPILER_LAUNCHER ${CCACHE_PROGRAM})
  set(CMAKE_CXX_COMPILER_LAUNCHER ${CCACHE_PROGRAM})
  set(CMAKE_CUDA_COMPILER_LAUNCHER ${CCACHE_PROGRAM})
endif()

# The repository root is the include root: #include "kernels/ops.h".
get_filename_component(TANDEM_ROOT "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)

# CUDA is optional: on when nvcc is found (e.g. /usr/local/cuda/bin/nvcc).
set(TANDEM_HAVE_CUDA OFF)
if(TANDEM_ENABLE_CUDA)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    # CMake 3.25 does not know the CUDA20 dialect flag (BUILD-NOTES trap).
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
    if(NOT CMAKE_CUDA_ARCHITECTURES)
      # Hopper (H100/H200) first; PTX for newer chips.
      set(CMAKE_CUDA_ARCHITECTURES 90)
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(TANDEM_HAVE_CUDA ON)
  endif()
endif()
message(STATUS "Tandem: CUDA part ${TANDEM_HAVE_CUDA}")

find_package(PkgConfig REQUIRED)
# The fuzz build (cmake/TandemFuzz.cmake) has no compute core and no tests.
if(NOT TANDEM_FUZZ)
  find_package(OpenMP REQUIRED COMPONENTS CXX)
  pkg_check_modules(OPENBLAS REQUIRED IMPORTED_TARGET openblas)
  find_package(GTest CONFIG)
endif()
# Tests are built by default; without GoogleTest that is a configure error,
# never a build that quietly has fewer tests.
if(TANDEM_BUILD_TESTS AND NOT GTest_FOUND)
  message(FATAL_ERROR "GoogleTest not found: install libgtest-dev libgmock-dev "
    "(deploy/install-deps.sh), or configure with -DTANDEM_BUILD_TESTS=OFF")
endif()
if(NOT TANDEM_FUZZ)
  find_package(benchmark CONFIG)
  include(GoogleTest)
endif()

# Warnings for our own targets.
function(tandem_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>)
endfunction()

# Fast math on hot CPU loops is opt-in per target; we want AVX2/FMA at least.
set(TANDEM_CPU_FLAGS -march=x86-64-v3 -mtune=znver3)

# tandem_add_subdirectories(DIR...): the folders of this CMakeLists.txt that
# join the build, in order. The list is the whole truth: a listed folder
# without a CMakeLists.txt, and a folder with one that is not listed, are
# configure errors naming the folder and the list to fix. A macro, so that
# the folders see (and may set) the caller's variables.
macro(tandem_add_subdirectories)
  set(_tandem_listed ${ARGN})
  file(GLOB _tandem_children RELATIVE ${CMAKE_CURRENT_SOURCE_DIR} ${CMAKE_CURRENT_SOURCE_DIR}/*/CMakeLists.txt)
  foreach(_tandem_child ${_tandem_children})
    get_filename_component(_tandem_child ${_tandem_child} DIRECTORY)
    if(NOT _tandem_child IN_LIST _tandem_listed)
      message(FATAL_ERROR "${CMAKE_CURRENT_SOURCE_DIR}/${_tandem_child} has a CMakeLists.txt but is not in the "
        "list of folders in ${CMAKE_CURRENT_LIST_FILE}: add it there")
    endif()
  endforeach()
  foreach(_tandem_child ${_tandem_listed})
    if(NOT EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/${_tandem_child}/CMakeLists.txt)
      message(FATAL_ERROR "${CMAKE_CURRENT_SOURCE_DIR}/${_tandem_child}/CMakeLists.txt not found: the folder "
        "${_tandem_child} is listed in ${CMAKE_CURRENT_LIST_FILE} but missing from the source tree")
    endif()
    add_subdirectory(${_tandem_child})
  endforeach()
endmacro()
