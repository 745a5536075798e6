#pragma once
// The scripted history plus what the issue-18 checks need on top: a shared lease and an emergency (critical)
// lease, so that allocated GPUs differ from the sum of the teams' GPUs in use.
#include <map>
#include <sstream>
#include <string>

#include "tests/quota/visibility_util.h"

namespace yolo8::quota::testing {

// After ScriptedHistory::run(): bob holds a shared yolov8n lease (lease 5, 4 GiB share), dave holds a critical
// lease of 3 whole GPUs (lease 6, emergency, review pending). Returns false if either was not granted.
inline bool add_shared_and_emergency(ScriptedHistory& history) {
  const int shared = history.post("/v1/leases", "bob-token", R"({"model":"yolov8n","shared":true,"job":"tiny"})");
  const int critical = history.post(
      "/v1/leases", "dave-token",
      R"({"model":"yolov8m","gpus":3,"priority":"critical","job":"hotfix","justification":"production outage"})");
  return shared == 201 && critical == 201;
}

// sample line "name{labels} value" -> value, keyed by "name{labels}"
inline std::map<std::string, double> parse_samples(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream is(text);
  std::string line;
  while (std::getline(is, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    out[line.substr(0, space)] = std::stod(line.substr(space + 1));
  }
  return out;
}

}  // namespace yolo8::quota::testing
