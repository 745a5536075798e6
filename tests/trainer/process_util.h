#pragma once
// Runs the built yolo8 binary as a child process, as a user or a Kubernetes Job would.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "test_paths.h"

namespace yolo8::test {

// Starts `yolo8 ARGS...` with extra environment variables; its stdout goes to `stdout_path` (/dev/null by default).
inline pid_t spawn_yolo8(const std::vector<std::string>& args, const std::map<std::string, std::string>& env = {},
                         const std::string& stdout_path = "/dev/null") {
  const std::string binary = std::string(kBinaryDir) + "/trainer/yolo8";
  const pid_t child = fork();
  if (child == 0) {
    for (const auto& [key, value] : env) setenv(key.c_str(), value.c_str(), 1);
    std::vector<char*> argv{const_cast<char*>(binary.c_str())};
    for (const auto& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
    argv.push_back(nullptr);
    if (!freopen(stdout_path.c_str(), "w", stdout)) _exit(127);
    execv(binary.c_str(), argv.data());
    _exit(127);
  }
  return child;
}

// Exit code, or 128 + signal for a killed child.
inline int exit_code_of(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

// A file the run wrote (its log, cost.json); "" when it is missing.
inline std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace yolo8::test
