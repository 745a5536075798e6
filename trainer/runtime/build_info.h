#pragma once
// What this yolo8 was built with and what it finds at run time: `yolo8 --version` prints it, so a bug report or a
// GPU node's log says which LibTorch, CUDA, cuDNN and NCCL a run used and whether it saw a GPU.

#include <string>
#include <vector>

namespace yolo8 {

struct BuildInfo {
  std::string yolo8_version;
  std::string libtorch_version;  // TORCH_VERSION of the headers built against
  bool cuda_built = false;       // YOLO8_WITH_CUDA: the CUDA path is compiled in
  std::string cuda_toolkit;      // the toolkit at build time ("" without CUDA)
  std::string cudnn_built;       // cudnn_version.h at build time
  std::string nccl_built;        // nccl.h at build time ("" when c10d has no NCCL backend)
  // Run time: the CUDA runtime and driver versions (0 when absent), cuDNN as loaded, and the visible GPUs.
  int cuda_runtime = 0;
  int cuda_driver = 0;
  long cudnn_loaded = 0;
  int nccl_loaded = 0;  // ncclGetVersion's code, 22809 for 2.28.9
  // The files the process loaded them from ("" when not loaded): in a container this shows they come from the image,
  // not from a library of the host's mounted in.
  std::string libtorch_path;
  std::string cudart_path;
  std::string cudnn_path;
  std::string nccl_path;
  std::vector<std::string> gpus;  // "0: NVIDIA H200 (139.8 GiB, compute capability 9.0)"
};

BuildInfo current_build_info();
// The file a library whose name starts with `soname` was mapped from, found in the text of /proc/self/maps
// ("" when none is).
std::string loaded_library_path(const std::string& maps_text, const std::string& soname);
// The lines of `yolo8 --version`.
std::string describe(const BuildInfo& info);

}  // namespace yolo8
