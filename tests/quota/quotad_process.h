#pragma once
// Runs the built quotad binary as a child process on an ephemeral loopback port, as a deployment would.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "test_paths.h"

namespace yolo8::test {

class QuotadProcess {
 public:
  // `listen`: HOST:PORT; a fixed port lets a replica restart where its clients and peers know it.
  QuotadProcess() = default;
  explicit QuotadProcess(std::string listen) : listen_(std::move(listen)) {}
  // Starts `quotad serve`; returns false (see the log) when it did not print its port within 10 s.
  // `env`: "NAME=value" entries set for quotad only (LD_PRELOAD of libfaketime, ...).
  bool start(const std::string& policy, const std::string& db, const std::string& log,
             const std::vector<std::string>& extra = {}, const std::vector<std::string>& env = {}) {
    const std::string bin = std::string(kBinaryDir) + "/quota/quotad";
    std::filesystem::remove(log);
    pid_ = fork();
    if (pid_ == 0) {
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      for (const std::string& entry : env) {
        const auto equals = entry.find('=');
        ::setenv(entry.substr(0, equals).c_str(), entry.substr(equals + 1).c_str(), 1);
      }
      std::vector<std::string> args = {bin, "serve", "--policy", policy, "--db", db, "--listen", listen_};
      args.insert(args.end(), extra.begin(), extra.end());
      std::vector<char*> argv;
      for (auto& arg : args) argv.push_back(arg.data());
      argv.push_back(nullptr);
      execv(bin.c_str(), argv.data());
      _exit(127);
    }
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < until) {
      std::ifstream in(log);
      const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      const auto at = text.find("://127.0.0.1:");
      if (at != std::string::npos && text.find(',', at) != std::string::npos) {
        port_ = std::stoi(text.substr(at + 13));
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }
  // Writes `policy_text` to root/policy.yaml and starts on it, with root/quota.db and root/quotad.log.
  bool start_in(const std::filesystem::path& root, const std::string& policy_text) {
    std::ofstream(root / "policy.yaml") << policy_text;
    return start((root / "policy.yaml").string(), (root / "quota.db").string(), (root / "quotad.log").string());
  }
  int port() const { return port_; }
  pid_t pid() const { return pid_; }  // to stop (SIGSTOP) and continue it
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  // SIGTERM and wait; true when quotad exited 0.
  bool stop() {
    if (pid_ <= 0) return true;
    ::kill(pid_, SIGTERM);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  // SIGKILL and wait: a crash, nothing flushed.
  void kill_hard() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }
  ~QuotadProcess() { kill_hard(); }

 private:
  std::string listen_ = "127.0.0.1:0";
  pid_t pid_ = -1;
  int port_ = 0;
};

// Runs `quotad ARGS` (each quoted for the shell) with stdout and stderr to `out`; its exit status. With `limit_s`,
// it is ended after that many seconds (a command expected to refuse must not hang the test when it does not).
inline int run_quotad(const std::vector<std::string>& args, const std::string& out, int limit_s = 0) {
  std::string command = (limit_s > 0 ? "timeout " + std::to_string(limit_s) + " " : std::string()) +
                        std::string(kBinaryDir) + "/quota/quotad";
  for (const std::string& arg : args) command += " '" + arg + "'";
  const int status = std::system((command + " > '" + out + "' 2>&1").c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// One node with one GPU, team `ta` with member alice (token "alice-token") and an admin ("admin-token"), yolov8n
// self-service, no credits: the smallest policy a trainer's lease runs under, with the lease timing a test needs.
inline std::string one_gpu_policy(int ttl_s, int heartbeat_interval_s) {
  return R"(
inventory:
  nodes:
    - {name: n1, gpus: 1, memory_gib: 24}
emergency_pool: 0
users:
  admin: {role: admin, token_sha256: 10a4c7c9fc5206d6f36dc6944a81bb6f4a3cb0e25014ae3b12e6c3e52712292a}
  alice: {token_sha256: 9c220f200955d76c0a38d308225e0ef10c5f971acaf2f8d1d8f732affa5bd1dc}
teams:
  ta: {base: 1, burst: 1, members: [alice]}
credits: {monthly_gpu_hours: 0}
leases: {ttl_s: )" +
         std::to_string(ttl_s) + ", heartbeat_interval_s: " + std::to_string(heartbeat_interval_s) +
         R"(, expiry_grace_s: 5}
tiers: {self_service: [yolov8n]}
)";
}

}  // namespace yolo8::test
