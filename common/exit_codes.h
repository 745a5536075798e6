#pragma once
// The process exit-code contract of both programs, yolo8 and quotad, that Kubernetes Jobs and scripts rely on
// (the README's exit codes; deploy/ maps them to Job outcomes).

namespace yolo8 {

inline constexpr int kExitCompleted = 0;   // the work finished
inline constexpr int kExitFailure = 1;     // anything unexpected: a retry may succeed
inline constexpr int kExitBadInput = 2;    // bad settings, data, weights or policy: retrying will not help
inline constexpr int kExitPreempted = 75;  // yielded cleanly (SIGTERM, lease revoked); resume continues

}  // namespace yolo8
