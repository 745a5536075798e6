#pragma once
// How many CPU threads LibTorch uses, from the `threads` setting, and the deterministic-algorithms switch.
// Every mode that computes calls it first (train, val, predict, profile).

#include "trainer/app/settings.h"

namespace yolo8 {

// threads=N uses N; 0 uses every core (LibTorch's own default is one thread on some machines).
void configure_threads(const Settings& settings);

}  // namespace yolo8
