#include "trainer/app/threads.h"

#include <torch/torch.h>

#include <algorithm>
#include <thread>

namespace yolo8 {

void configure_threads(const Settings& settings) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  torch::set_num_threads(settings.threads > 0 ? settings.threads : cores);
  at::globalContext().setDeterministicAlgorithms(settings.deterministic, /*warn_only=*/true);
}

}  // namespace yolo8
