#pragma once
// How many CPU threads LibTorch uses, from the `threads` setting, and the deterministic-algorithms switch.
// Every mode that computes calls it first (train, val, predict, profile).

#include <string>

#include "trainer/cli/settings.h"
#include "trainer/runtime/cpu_share.h"

namespace yolo8 {

// threads=N uses N; 0 uses this process's CPU share (affinity and cgroup quota, not the host's core count).
// Returns the share and the thread count chosen.
struct ThreadChoice {
  CpuShare share;
  int threads = 1;
  std::string explain() const;  // "CPU: 2 compute threads (threads=0: 2 of 2 cores; ...)"
};
ThreadChoice configure_threads(const Settings& settings);

// deterministic=true: deterministic algorithms (warn-only), cuDNN deterministic without autotuning, and
// CUBLAS_WORKSPACE_CONFIG=:4096:8 unless set, before any CUDA work; LibTorch's NaN fill of uninitialised memory
// stays off either way. On CPU a run is bitwise reproducible for a fixed thread count with or without it.
void configure_determinism(bool deterministic);

// `workers` capped to the CPU share: loader threads beyond it only wait for a core.
int loader_workers(int requested, const CpuShare& share);

// Whether checkpoints are encoded on the checkpoint writer's thread, while training goes on, rather than on the
// training thread: only where a core is free for it, on a GPU or with fewer compute threads than cores. With a
// compute thread on every core, a third busy thread preempts them inside their OpenMP regions (one then waits at
// the barrier for the other): yolov8n on 2 cores and 2 threads trained no faster with the 60-130 ms an epoch of
// encoding moved off its thread.
bool encode_checkpoints_in_background(bool on_gpu, int compute_threads, const CpuShare& share);

}  // namespace yolo8
