#include "trainer/app/threads.h"

#include <unistd.h>

#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>

namespace yolo8 {

std::string ThreadChoice::explain() const {
  return "CPU: " + std::to_string(threads) + " compute threads (" + share.explain() + ")";
}

ThreadChoice configure_threads(const Settings& settings) {
  ThreadChoice choice;
  choice.share = current_cpu_share();
  choice.threads = settings.threads > 0 ? settings.threads : choice.share.cores;
  torch::set_num_threads(choice.threads);
  at::globalContext().setDeterministicAlgorithms(settings.deterministic, /*warn_only=*/true);
  return choice;
}

int loader_workers(int requested, const CpuShare& share) { return std::max(0, std::min(requested, share.cores)); }

void reexec_with_passive_openmp_wait(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") || std::getenv("GOMP_SPINCOUNT")) return;
  setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
  execv("/proc/self/exe", argv);
  // The exec failed (no /proc): run on with the runtime's own waiting.
}

}  // namespace yolo8
