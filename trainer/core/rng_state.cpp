#include "trainer/core/rng_state.h"

#include <mutex>

namespace yolo8 {
namespace {

torch::Tensor generator_state(at::Generator gen) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_generator_state(at::Generator gen, const torch::Tensor& state, const std::string& what) {
  if (!state.defined() || state.scalar_type() != torch::kByte || state.dim() != 1) {
    throw std::invalid_argument("random state for " + what + ": expected a 1-D uint8 tensor");
  }
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state.cpu().contiguous());
}

}  // namespace

RngState capture_torch_rng() {
  RngState s;
  s.torch_cpu = generator_state(at::detail::getDefaultCPUGenerator());
  if (torch::cuda::is_available()) {
    const auto n = static_cast<int>(torch::cuda::device_count());
    for (int i = 0; i < n; ++i) {
      s.torch_cuda.push_back(generator_state(at::globalContext().defaultGenerator(c10::Device(c10::kCUDA, i))));
    }
  }
  return s;
}

void restore_torch_rng(const RngState& state) {
  if (state.torch_cpu.defined()) set_generator_state(at::detail::getDefaultCPUGenerator(), state.torch_cpu, "the CPU");
  if (state.torch_cuda.empty()) return;
  const auto n = torch::cuda::is_available() ? static_cast<size_t>(torch::cuda::device_count()) : 0;
  // Restore what fits: a run resumed on fewer devices keeps the states it can use.
  for (size_t i = 0; i < state.torch_cuda.size() && i < n; ++i) {
    set_generator_state(at::globalContext().defaultGenerator(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(i))),
                        state.torch_cuda[i], "CUDA device " + std::to_string(i));
  }
}

}  // namespace yolo8
