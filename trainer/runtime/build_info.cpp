#include "trainer/runtime/build_info.h"

#include <torch/torch.h>
#include <torch/version.h>

#ifdef YOLO8_WITH_CUDA
#include <cuda_runtime_api.h>

#include <ATen/cuda/CUDAContext.h>
#endif

#include <dlfcn.h>

#include <cstdio>
#include <fstream>
#include <sstream>

namespace yolo8 {
namespace {

// 13000 -> "13.0", 12080 -> "12.8".
std::string cuda_version_text(int version) {
  return std::to_string(version / 1000) + "." + std::to_string((version % 1000) / 10);
}

// 91900 -> "9.19.0" (cuDNN 9's encoding: major*10000 + minor*100 + patch).
std::string cudnn_version_text(long version) {
  return std::to_string(version / 10000) + "." + std::to_string((version % 10000) / 100) + "." +
         std::to_string(version % 100);
}

// 22809 -> "2.28.9" (NCCL_VERSION_CODE since 2.9: major*10000 + minor*100 + patch).
std::string nccl_version_text(int version) {
  return std::to_string(version / 10000) + "." + std::to_string((version % 10000) / 100) + "." +
         std::to_string(version % 100);
}

std::string read_own_maps() {
  std::ifstream maps("/proc/self/maps");
  std::ostringstream text;
  text << maps.rdbuf();
  return text.str();
}

std::string from(const std::string& path) { return path.empty() ? std::string() : " from " + path; }

}  // namespace

std::string loaded_library_path(const std::string& maps_text, const std::string& soname) {
  std::istringstream lines(maps_text);
  std::string line;
  while (std::getline(lines, line)) {
    const size_t path_start = line.find('/');
    if (path_start == std::string::npos) continue;
    const std::string path = line.substr(path_start);
    const size_t name_start = path.rfind('/') + 1;
    if (path.compare(name_start, soname.size(), soname) == 0) return path;
  }
  return {};
}

BuildInfo current_build_info() {
  BuildInfo info;
  info.yolo8_version = YOLO8_VERSION;
  info.libtorch_version = TORCH_VERSION;
#ifdef YOLO8_WITH_CUDA
  info.cuda_built = true;
  info.cuda_toolkit = YOLO8_CUDA_VERSION;
  info.cudnn_built = YOLO8_CUDNN_VERSION;
#ifdef YOLO8_HAVE_NCCL
  info.nccl_built = YOLO8_NCCL_VERSION;
#endif
  // Neither call creates a context: safe on a node whose GPUs are leased to others.
  if (cudaRuntimeGetVersion(&info.cuda_runtime) != cudaSuccess) info.cuda_runtime = 0;
  if (cudaDriverGetVersion(&info.cuda_driver) != cudaSuccess) info.cuda_driver = 0;
  // libtorch_cuda loads cuDNN and NCCL at start; asking the loaded libraries (rather than our headers) tells which
  // files a container actually runs. Neither call needs a GPU.
  if (auto cudnn_get_version = reinterpret_cast<size_t (*)()>(dlsym(RTLD_DEFAULT, "cudnnGetVersion"))) {
    info.cudnn_loaded = static_cast<long>(cudnn_get_version());
  }
  if (auto nccl_get_version = reinterpret_cast<int (*)(int*)>(dlsym(RTLD_DEFAULT, "ncclGetVersion"))) {
    int version = 0;
    if (nccl_get_version(&version) == 0) info.nccl_loaded = version;
  }
  if (torch::cuda::is_available()) {
    for (int64_t i = 0; i < static_cast<int64_t>(torch::cuda::device_count()); ++i) {
      const cudaDeviceProp* props = at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(i));
      char memory[32];
      std::snprintf(memory, sizeof memory, "%.1f GiB", static_cast<double>(props->totalGlobalMem) / (1ull << 30));
      info.gpus.push_back(std::to_string(i) + ": " + props->name + " (" + memory + ", compute capability " +
                          std::to_string(props->major) + "." + std::to_string(props->minor) + ")");
    }
  }
  const std::string maps = read_own_maps();
  info.cudart_path = loaded_library_path(maps, "libcudart.so");
  info.cudnn_path = loaded_library_path(maps, "libcudnn.so");
  info.nccl_path = loaded_library_path(maps, "libnccl.so");
  info.libtorch_path = loaded_library_path(maps, "libtorch_cuda.so");
#else
  info.libtorch_path = loaded_library_path(read_own_maps(), "libtorch_cpu.so");
#endif
  return info;
}

std::string describe(const BuildInfo& info) {
  std::ostringstream out;
  out << "yolo8 " << info.yolo8_version << "\n";
  out << "LibTorch " << info.libtorch_version << (info.cuda_built ? " (CUDA build)" : " (CPU-only build)")
      << from(info.libtorch_path) << "\n";
  if (!info.cuda_built) {
    out << "CUDA: not compiled in (this build trains on the CPU only)\n";
    return out.str();
  }
  out << "CUDA " << info.cuda_toolkit << " (toolkit at build); runtime "
      << (info.cuda_runtime ? cuda_version_text(info.cuda_runtime) + from(info.cudart_path) : std::string("not loaded"))
      << ", driver " << (info.cuda_driver ? cuda_version_text(info.cuda_driver) : std::string("none")) << "\n";
  out << "cuDNN " << info.cudnn_built << " (at build)";
  if (info.cudnn_loaded) out << "; " << cudnn_version_text(info.cudnn_loaded) << " loaded" << from(info.cudnn_path);
  out << "\n";
  out << "NCCL " << (info.nccl_built.empty() ? std::string("not compiled in") : info.nccl_built + " (at build)");
  if (info.nccl_loaded) out << "; " << nccl_version_text(info.nccl_loaded) << " loaded" << from(info.nccl_path);
  out << "\n";
  if (info.gpus.empty()) {
    out << "GPU: none visible" << (info.cuda_driver ? "" : " (no NVIDIA driver)") << "\n";
  } else {
    out << "GPU: " << info.gpus.size() << " visible\n";
    for (const auto& gpu : info.gpus) out << "  " << gpu << "\n";
  }
  return out.str();
}

}  // namespace yolo8
