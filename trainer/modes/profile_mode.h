#pragma once
// `yolo8 profile`: peak memory and speed of training steps on synthetic batches (batch=auto:
// batch/auto_batch_profile.h).

#include <torch/torch.h>

#include <string>
#include <vector>

#include "models/yolo.h"
#include "trainer/cli/settings.h"

namespace yolo8 {

// `yolo8 profile model=... variants=n,s batch=1,2,4 imgsz=640`: table, JSON and the memory table.
int run_profile(const Settings& settings, const std::vector<std::string>& variants, const std::vector<int>& batches);

}  // namespace yolo8
