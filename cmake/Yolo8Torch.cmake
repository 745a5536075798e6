# LibTorch for yolo8: the CUDA build inside PyPI's torch wheel (scripts/locks/torch.txt, installed into .venv/torch
# by scripts/pyenv.sh), with the CUDA toolkit it was built with. Sets YOLO8_WITH_CUDA, YOLO8_HAVE_NCCL and the
# versions `yolo8 info` prints. -DTorch_DIR=... (or CMAKE_PREFIX_PATH) chooses another LibTorch.
#
# Checked here rather than at the first link error or crash:
# - the CUDA toolkit is found explicitly, and its version is the one torch was built with;
# - no GPU architecture probe runs (TORCH_CUDA_ARCH_LIST has a default);
# - the C++ ABI of torch equals that of our Debian libraries (_GLIBCXX_USE_CXX11_ABI), by linking a call through
#   std::string into libc10;
# - nccl.h is the NCCL torch was built with (ProcessGroupNCCL's Options embed ncclConfig_t, whose layout follows it);
# - YOLO8_REQUIRE_CUDA=ON (what scripts/setup.sh passes) fails the configure when the CUDA path would be left out.

# MAJOR.MINOR.PATCH of a header that defines them as `#define NAME N` (nccl.h, cudnn_version.h).
function(yolo8_header_version header major_name minor_name patch_name out)
  file(STRINGS "${header}" defines REGEX "^#define (${major_name}|${minor_name}|${patch_name}) ")
  set(parts)
  foreach(name ${major_name} ${minor_name} ${patch_name})
    string(REGEX REPLACE ".*${name} ([0-9]+).*" "\\1" value "${defines}")
    list(APPEND parts ${value})
  endforeach()
  list(JOIN parts "." version)
  set(${out} "${version}" PARENT_SCOPE)
endfunction()

option(YOLO8_REQUIRE_CUDA "Fail the configure unless LibTorch is a CUDA build and the CUDA path is compiled" OFF)

if(NOT Torch_DIR AND NOT DEFINED ENV{Torch_DIR})
  file(GLOB yolo8_venv_torch_dirs "${PROJECT_SOURCE_DIR}/.venv/torch/lib/python3*/site-packages/torch/share/cmake/Torch")
  if(yolo8_venv_torch_dirs)
    list(GET yolo8_venv_torch_dirs 0 yolo8_venv_torch_dir)
    set(Torch_DIR "${yolo8_venv_torch_dir}" CACHE PATH "LibTorch's CMake package (default: .venv/torch)")
  endif()
endif()

# TorchConfig.cmake looks for Caffe2's config and for libtorch/libc10 with PATHS, which CMake searches after the
# system's folders: on a machine that also has Debian's libtorch-dev (1.13) those would win. Both are pinned to the
# LibTorch of Torch_DIR.
if(Torch_DIR AND EXISTS "${Torch_DIR}/../Caffe2/Caffe2Config.cmake")
  get_filename_component(yolo8_torch_root "${Torch_DIR}/../../.." ABSOLUTE)
  get_filename_component(yolo8_caffe2_dir "${Torch_DIR}/../Caffe2" ABSOLUTE)
  set(Caffe2_DIR "${yolo8_caffe2_dir}" CACHE PATH "Caffe2's CMake package, beside Torch_DIR")
  find_library(TORCH_LIBRARY torch PATHS "${yolo8_torch_root}/lib" NO_DEFAULT_PATH)
  find_library(c10_LIBRARY c10 PATHS "${yolo8_torch_root}/lib" NO_DEFAULT_PATH)
  find_library(C10_CUDA_LIBRARY c10_cuda PATHS "${yolo8_torch_root}/lib" NO_DEFAULT_PATH)
endif()

# H100/H200 (9.0) plus the cards a department already has (A100 8.0, A10/RTX 30 8.6, L4/L40/RTX 40 8.9). Without a
# list torch probes the local GPU, and on a machine without one it falls back to eleven architectures.
if(NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  set(TORCH_CUDA_ARCH_LIST "8.0;8.6;8.9;9.0" CACHE STRING "GPU architectures for CUDA code (torch's format)")
endif()

# The toolkit before torch: where nvcc is not on the PATH, the usual install folder.
if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
  find_program(yolo8_nvcc nvcc)
  if(NOT yolo8_nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc CACHE FILEPATH "nvcc")
  endif()
endif()
find_package(CUDAToolkit QUIET)
# CUDA 12.9 dropped libnvToolsExt (NVTX 3 is header-only): a LibTorch 2.x config that still names CUDA::nvToolsExt
# gets the header-only target under that name.
if(CUDAToolkit_FOUND AND NOT TARGET CUDA::nvToolsExt AND TARGET CUDA::nvtx3)
  add_library(CUDA::nvToolsExt INTERFACE IMPORTED)
  target_link_libraries(CUDA::nvToolsExt INTERFACE CUDA::nvtx3)
endif()

find_package(Torch REQUIRED)

# One switch for every CUDA-only line of code.
if(TORCH_CUDA_LIBRARIES OR CAFFE2_USE_CUDA)
  set(YOLO8_WITH_CUDA ON)
else()
  set(YOLO8_WITH_CUDA OFF)
endif()

if(YOLO8_WITH_CUDA)
  if(NOT CUDAToolkit_FOUND)
    message(FATAL_ERROR "yolo8: LibTorch (${Torch_DIR}) is a CUDA build but no CUDA toolkit was found: "
                        "put nvcc on the PATH or set CUDAToolkit_ROOT")
  endif()
  # torch/version.py of the wheel names the CUDA it was built with.
  set(yolo8_torch_version_py "${Torch_DIR}/../../../version.py")
  if(EXISTS "${yolo8_torch_version_py}")
    file(STRINGS "${yolo8_torch_version_py}" yolo8_torch_cuda_line REGEX "^cuda")
    if(yolo8_torch_cuda_line MATCHES "'([0-9]+\\.[0-9]+)'")
      set(YOLO8_TORCH_BUILT_WITH_CUDA ${CMAKE_MATCH_1})
      string(REGEX MATCH "^[0-9]+\\.[0-9]+" yolo8_toolkit_mm "${CUDAToolkit_VERSION}")
      if(NOT yolo8_toolkit_mm VERSION_EQUAL YOLO8_TORCH_BUILT_WITH_CUDA)
        message(FATAL_ERROR "yolo8: LibTorch was built with CUDA ${YOLO8_TORCH_BUILT_WITH_CUDA}, but the toolkit "
                            "found is ${CUDAToolkit_VERSION} (${CUDAToolkit_BIN_DIR}): install CUDA "
                            "${YOLO8_TORCH_BUILT_WITH_CUDA} or pin the torch build of this toolkit in "
                            "scripts/locks/torch.txt")
      endif()
    endif()
  endif()
  set(YOLO8_CUDA_VERSION ${CUDAToolkit_VERSION})

  # NCCL: the header must be the library torch links (the same major.minor).
  find_path(YOLO8_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  find_library(YOLO8_NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${CUDAToolkit_LIBRARY_DIR})
  set(YOLO8_HAVE_NCCL OFF)
  if(YOLO8_NCCL_INCLUDE_DIR AND YOLO8_NCCL_LIBRARY)
    yolo8_header_version("${YOLO8_NCCL_INCLUDE_DIR}/nccl.h" NCCL_MAJOR NCCL_MINOR NCCL_PATCH YOLO8_NCCL_VERSION)
    string(REGEX MATCH "^[0-9]+\\.[0-9]+" yolo8_nccl_major_minor "${YOLO8_NCCL_VERSION}")
    # The NCCL torch was built against: the wheel pins nvidia-nccl-cu13 in its metadata.
    file(GLOB yolo8_torch_dist_metadata "${Torch_DIR}/../../../../torch-*.dist-info/METADATA")
    if(yolo8_torch_dist_metadata)
      file(STRINGS "${yolo8_torch_dist_metadata}" yolo8_torch_nccl_req REGEX "^Requires-Dist: nvidia-nccl")
      if(yolo8_torch_nccl_req MATCHES "==([0-9]+)\\.([0-9]+)\\.([0-9]+)")
        set(yolo8_torch_nccl "${CMAKE_MATCH_1}.${CMAKE_MATCH_2}")
        if(NOT yolo8_torch_nccl VERSION_EQUAL yolo8_nccl_major_minor)
          message(FATAL_ERROR "yolo8: ${YOLO8_NCCL_INCLUDE_DIR}/nccl.h is NCCL ${YOLO8_NCCL_VERSION}, but LibTorch was "
                              "built with NCCL ${CMAKE_MATCH_1}.${CMAKE_MATCH_2}.${CMAKE_MATCH_3} "
                              "(${yolo8_torch_dist_metadata}): ProcessGroupNCCL's layout follows the header; "
                              "install that NCCL's headers or set YOLO8_NCCL_INCLUDE_DIR")
        endif()
      endif()
    endif()
    set(YOLO8_HAVE_NCCL ON)
  endif()

  # cuDNN's version, for `yolo8 info` (torch reports the one it loads at run time too).
  find_file(YOLO8_CUDNN_VERSION_H cudnn_version.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  if(YOLO8_CUDNN_VERSION_H)
    yolo8_header_version("${YOLO8_CUDNN_VERSION_H}" CUDNN_MAJOR CUDNN_MINOR CUDNN_PATCHLEVEL YOLO8_CUDNN_VERSION)
  endif()
endif()

if(YOLO8_REQUIRE_CUDA AND NOT YOLO8_WITH_CUDA)
  message(FATAL_ERROR "yolo8: YOLO8_REQUIRE_CUDA is ON but LibTorch (${Torch_DIR}) is not a CUDA build: the CUDA "
                      "path would be configured out (run scripts/pyenv.sh torch, or pass -DYOLO8_REQUIRE_CUDA=OFF "
                      "for a CPU-only LibTorch)")
endif()
if(YOLO8_REQUIRE_CUDA AND NOT YOLO8_HAVE_NCCL)
  message(FATAL_ERROR "yolo8: YOLO8_REQUIRE_CUDA is ON but no nccl.h/libnccl was found in the CUDA toolkit "
                      "(${CUDAToolkit_INCLUDE_DIRS}): c10d's NCCL backend would be configured out")
endif()

# Gloo's headers for c10d's CPU backend (the wheel ships Gloo inside libtorch_cpu but not its headers; Debian's
# libgloo-dev has them). trainer/core/distributed.cpp compiles the Gloo backend only where they are found.
find_path(YOLO8_GLOO_INCLUDE_DIR gloo/config.h)
if(YOLO8_REQUIRE_CUDA AND NOT YOLO8_GLOO_INCLUDE_DIR)
  message(FATAL_ERROR "yolo8: gloo/config.h not found: data-parallel CPU training would be configured out "
                      "(Debian: apt-get install libgloo-dev, which scripts/setup.sh installs)")
endif()

# The C++ ABI: a call with a std::string argument into libc10 links only when both sides agree.
if(NOT DEFINED YOLO8_TORCH_ABI_OK)
  set(yolo8_abi_dir "${PROJECT_BINARY_DIR}/CMakeFiles/yolo8_torch_abi")
  file(WRITE "${yolo8_abi_dir}/abi.cpp"
       "#include <c10/util/Exception.h>\n#include <string>\n"
       "int main(int argc, char**) { if (argc > 5) c10::detail::torchCheckFail(\"f\", \"file\", 1, std::string(\"m\"));"
       " return 0; }\n")
  get_target_property(yolo8_c10_location c10 IMPORTED_LOCATION)
  if(NOT yolo8_c10_location)
    get_target_property(yolo8_c10_location c10 IMPORTED_LOCATION_RELEASE)
  endif()
  try_compile(yolo8_abi_links "${yolo8_abi_dir}/build" SOURCES "${yolo8_abi_dir}/abi.cpp"
              CMAKE_FLAGS "-DINCLUDE_DIRECTORIES=${TORCH_INCLUDE_DIRS}"
              COMPILE_DEFINITIONS ${TORCH_CXX_FLAGS}
              LINK_LIBRARIES "${yolo8_c10_location}"
              CXX_STANDARD 17
              OUTPUT_VARIABLE yolo8_abi_output)
  if(NOT yolo8_abi_links)
    message(FATAL_ERROR "yolo8: a call into LibTorch's libc10 with a std::string does not link: LibTorch's C++ ABI "
                        "(_GLIBCXX_USE_CXX11_ABI, TORCH_CXX_FLAGS='${TORCH_CXX_FLAGS}') differs from this compiler's "
                        "and Debian's libraries (the new ABI). Use a LibTorch built with the CXX11 ABI, e.g. PyPI's "
                        "torch >= 2.7.\n${yolo8_abi_output}")
  endif()
  set(YOLO8_TORCH_ABI_OK ON CACHE INTERNAL "LibTorch's C++ ABI matches")
endif()
string(FIND "${TORCH_CXX_FLAGS}" "_GLIBCXX_USE_CXX11_ABI=0" yolo8_old_abi)
if(NOT yolo8_old_abi EQUAL -1)
  message(FATAL_ERROR "yolo8: LibTorch asks for the pre-C++11 string ABI (TORCH_CXX_FLAGS='${TORCH_CXX_FLAGS}'), "
                      "Debian's yaml-cpp, OpenCV and GoogleTest use the new one: use a CXX11-ABI LibTorch")
endif()

# torch 2.x headers need C++17; the project's standard must not be below what torch's target asks for.
get_target_property(yolo8_torch_cxx_standard torch CXX_STANDARD)
if(yolo8_torch_cxx_standard AND yolo8_torch_cxx_standard GREATER CMAKE_CXX_STANDARD)
  message(FATAL_ERROR "yolo8: LibTorch ${Torch_VERSION} needs C++${yolo8_torch_cxx_standard}; "
                      "the project builds with C++${CMAKE_CXX_STANDARD}")
endif()

# The wheel's libtorch.so and libtorch_cpu.so export std::filesystem (and other std::) functions of the newer
# libstdc++ they were built with; the dynamic linker binds our calls to the first library that defines a symbol, in
# DT_NEEDED order, where libstdc++ comes last: std::filesystem::remove_all then jumped to a null address inside
# libtorch.so. libstdc++ is therefore made the first library every executable and shared library needs
# (tests/architecture checks the order in yolo8).
add_link_options("LINKER:--push-state,--no-as-needed" "-lstdc++" "LINKER:--pop-state")
