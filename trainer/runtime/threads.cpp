#include "trainer/runtime/threads.h"

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
  configure_determinism(settings.deterministic);
  return choice;
}

void configure_determinism(bool deterministic) {
  // Warn-only, as Ultralytics: an op without a deterministic kernel (upsample's backward on CUDA) still runs; its
  // warning is printed once (trainer/runtime/torch_warnings.h).
  at::globalContext().setDeterministicAlgorithms(deterministic, /*warn_only=*/true);
  // LibTorch 2.x fills every uninitialised tensor with NaN while deterministic algorithms are on, so that a read of
  // garbage is reproducible. No kernel we run reads memory it has not written; the fill would only cost time.
  at::globalContext().setDeterministicFillUninitializedMemory(false);
  // cuDNN: deterministic kernels and no autotuning (its choice depends on timings).
  at::globalContext().setDeterministicCuDNN(deterministic);
  at::globalContext().setBenchmarkCuDNN(false);
  // cuBLAS reduces in a fixed order only with a fixed workspace; it reads the variable when its first handle is
  // created, which is after this (no CUDA work has been done yet). A value the user set is kept.
  if (deterministic) setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
}

int loader_workers(int requested, const CpuShare& share) { return std::max(0, std::min(requested, share.cores)); }

bool encode_checkpoints_in_background(bool on_gpu, int compute_threads, const CpuShare& share) {
  return on_gpu || compute_threads < share.cores;
}

}  // namespace yolo8
