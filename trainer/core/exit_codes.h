#pragma once
// The process exit-code contract that Kubernetes Jobs and scripts rely on (README, deploy/).

namespace yolo8 {

inline constexpr int kExitCompleted = 0;   // the work finished
inline constexpr int kExitFailure = 1;     // anything unexpected
inline constexpr int kExitBadInput = 2;    // bad settings, data or weights: retrying will not help
inline constexpr int kExitPreempted = 75;  // yielded cleanly (SIGTERM, lease revoked); resume continues

}  // namespace yolo8
