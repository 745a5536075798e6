#pragma once
// Shared helpers for the quota tests: the example policy, fixed clock points, temporary databases and files, lease
// requests.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "quota/core/policy.h"
#include "quota/service/service.h"
#include "test_paths.h"

namespace yolo8::quota::testing {

// Monday 2026-11-30 00:00 UTC.
inline constexpr int64_t kMonday = 1795996800000;
inline constexpr int64_t kHour = 3600000;
inline constexpr int64_t kMinute = 60000;

inline std::string example_policy_path() { return std::string(yolo8::test::kSourceDir) + "/configs/quota-policy.yaml"; }
inline Policy example_policy() { return load_policy(example_policy_path()); }

// The folder the tests' databases, logs and outputs go to, under the build tree (created).
inline std::string test_dir() {
  const std::string dir = std::string(yolo8::test::kBinaryDir) + "/quota_test_tmp";
  std::filesystem::create_directories(dir);
  return dir;
}

// A fresh path for a test database in test_dir() (any earlier file and its WAL removed); the pid keeps test binaries
// running in parallel apart.
inline std::string temp_db(const std::string& name) {
  const std::string path = test_dir() + "/" + name + "_" + std::to_string(::getpid()) + ".db";
  for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(path + suffix);
  return path;
}

// The whole text of a file ("" when it is missing).
inline std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A whole-GPU yolov8s lease request of `user` in `team`.
inline LeaseRequest lease_request(const std::string& team, const std::string& user, int gpus = 1) {
  LeaseRequest request;
  request.team = team;
  request.user = user;
  request.job = "job";
  request.model = "yolov8s";
  request.gpus = gpus;
  return request;
}

// A request to QuotaService::handle, as the HTTP front would build it.
inline ApiRequest api_call(const std::string& method, const std::string& path, const std::string& token,
                           const std::string& body = "") {
  ApiRequest r;
  r.method = method;
  r.path = path;
  r.token = token;
  r.body = body;
  return r;
}

}  // namespace yolo8::quota::testing
