#pragma once
// Shared helpers for the quota tests: the example policy and fixed clock points.
#include <string>

#include "quota/policy.h"
#include "test_paths.h"

namespace yolo8::quota::testing {

// Monday 2026-11-30 00:00 UTC.
inline constexpr int64_t kMonday = 1795996800000;
inline constexpr int64_t kHour = 3600000;
inline constexpr int64_t kMinute = 60000;

inline std::string example_policy_path() { return std::string(yolo8::test::kSourceDir) + "/configs/quota-policy.yaml"; }
inline Policy example_policy() { return load_policy(example_policy_path()); }

}  // namespace yolo8::quota::testing
