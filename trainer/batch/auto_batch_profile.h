#pragma once
// `yolo8 profile variants=n,s,m,l,x imgsz=640 batch=auto gpu_mem=24`: what batch=auto picks for each variant under
// one memory budget, and whether it holds. On synthetic batches, so it runs on a bare GPU machine.

#include <torch/torch.h>

#include <string>
#include <vector>

#include "trainer/cli/settings.h"

namespace yolo8 {

struct AutoBatchProfileRow {
  std::string variant;
  bool fits = false;  // false: not even batch 1 fits the budget
  int batch = 0;
  int accumulate = 1;
  double budget_bytes = 0;  // the budget the batch was sized to (after the batch fraction)
  double predicted_peak_bytes = 0;
  double verified_peak_bytes = 0;   // auto-batch's own verification step
  double confirmed_peak_bytes = 0;  // three more training steps and a validation at twice the batch
  int verification_retries = 0;     // verification steps that did not fit and made it step down
  int out_of_memory_after = 0;      // out-of-memory errors in the confirmation steps (must be 0)
  double step_seconds = 0;          // mean of the confirmation training steps
};

// Sizes, verifies and confirms the batch for each variant; prints a table and writes auto_batch.json into a run
// folder `profile` (profile2, ...) under the project folder (runs/detect). The budget is gpu_mem GiB (else the device's
// memory) and is enforced as a cap.
std::vector<AutoBatchProfileRow> run_auto_batch_profile(const Settings& settings,
                                                        const std::vector<std::string>& variants);

std::string format_auto_batch_profile(const std::vector<AutoBatchProfileRow>& rows);

}  // namespace yolo8
