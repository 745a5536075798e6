#include "trainer/app/build_info.h"

#include <torch/torch.h>
#include <torch/version.h>

#ifdef YOLO8_WITH_CUDA
#include <cuda_runtime_api.h>

#include <ATen/cuda/CUDAContext.h>
#include <ATen/detail/CUDAHooksInterface.h>
#endif

#include <cstdio>
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

}  // namespace

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
  if (torch::cuda::is_available()) {
    if (at::detail::getCUDAHooks().hasCuDNN()) info.cudnn_loaded = at::detail::getCUDAHooks().versionCuDNN();
    for (int64_t i = 0; i < static_cast<int64_t>(torch::cuda::device_count()); ++i) {
      const cudaDeviceProp* props = at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(i));
      char memory[32];
      std::snprintf(memory, sizeof memory, "%.1f GiB", static_cast<double>(props->totalGlobalMem) / (1ull << 30));
      info.gpus.push_back(std::to_string(i) + ": " + props->name + " (" + memory + ", compute capability " +
                          std::to_string(props->major) + "." + std::to_string(props->minor) + ")");
    }
  }
#endif
  return info;
}

std::string describe(const BuildInfo& info) {
  std::ostringstream out;
  out << "yolo8 " << info.yolo8_version << "\n";
  out << "LibTorch " << info.libtorch_version << (info.cuda_built ? " (CUDA build)" : " (CPU-only build)") << "\n";
  if (!info.cuda_built) {
    out << "CUDA: not compiled in (this build trains on the CPU only)\n";
    return out.str();
  }
  out << "CUDA " << info.cuda_toolkit << " (toolkit at build); runtime "
      << (info.cuda_runtime ? cuda_version_text(info.cuda_runtime) : std::string("not loaded")) << ", driver "
      << (info.cuda_driver ? cuda_version_text(info.cuda_driver) : std::string("none")) << "\n";
  out << "cuDNN " << info.cudnn_built << " (at build)";
  if (info.cudnn_loaded) out << "; " << cudnn_version_text(info.cudnn_loaded) << " loaded";
  out << "\n";
  out << "NCCL " << (info.nccl_built.empty() ? std::string("not compiled in") : info.nccl_built + " (at build)")
      << "\n";
  if (info.gpus.empty()) {
    out << "GPU: none visible" << (info.cuda_driver ? "" : " (no NVIDIA driver)") << "\n";
  } else {
    out << "GPU: " << info.gpus.size() << " visible\n";
    for (const auto& gpu : info.gpus) out << "  " << gpu << "\n";
  }
  return out.str();
}

}  // namespace yolo8
