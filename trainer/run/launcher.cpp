#include "trainer/run/launcher.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace yolo8 {

namespace {

std::atomic<int> g_forward_signal{0};

void remember_signal(int signal_number) { g_forward_signal.store(signal_number); }

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

std::string self_executable() {
  std::vector<char> buffer(4096);
  const ssize_t length = ::readlink("/proc/self/exe", buffer.data(), buffer.size() - 1);
  if (length <= 0) throw std::runtime_error("cannot resolve /proc/self/exe to re-execute the trainer");
  return std::string(buffer.data(), static_cast<size_t>(length));
}

}  // namespace

int find_free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error(std::string("socket() failed: ") + std::strerror(errno));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    const std::string reason = std::strerror(errno);
    ::close(fd);
    throw std::runtime_error("cannot find a free port on 127.0.0.1: " + reason);
  }
  ::close(fd);
  return ntohs(address.sin_port);
}

int launch_local_workers(const std::vector<int>& device_ids, const std::vector<std::string>& args,
                         const LaunchOptions& options) {
  if (device_ids.empty()) throw std::invalid_argument("launch_local_workers needs at least one device");
  const std::string executable = options.executable.empty() ? self_executable() : options.executable;
  const int port = options.master_port > 0 ? options.master_port : find_free_port();
  const int world = static_cast<int>(device_ids.size());

  // Everything a child needs is built before fork(): only async-signal-safe calls happen in the child.
  std::vector<std::string> base_env;
  const std::vector<std::string> replaced = {"RANK",        "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                             "MASTER_ADDR", "MASTER_PORT"};
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const std::string line(*entry);
    const std::string key = line.substr(0, line.find('='));
    bool drop = options.extra_env.count(key) > 0;
    for (const auto& name : replaced) drop = drop || key == name;
    if (!drop) base_env.push_back(line);
  }
  for (const auto& item : options.extra_env) base_env.push_back(item.first + "=" + item.second);

  std::vector<std::vector<std::string>> child_env(static_cast<size_t>(world), base_env);
  for (int rank = 0; rank < world; ++rank) {
    auto& env = child_env[static_cast<size_t>(rank)];
    env.push_back("RANK=" + std::to_string(rank));
    env.push_back("LOCAL_RANK=" + std::to_string(rank));
    env.push_back("WORLD_SIZE=" + std::to_string(world));
    env.push_back("LOCAL_WORLD_SIZE=" + std::to_string(world));
    env.push_back("MASTER_ADDR=127.0.0.1");
    env.push_back("MASTER_PORT=" + std::to_string(port));
  }
  std::vector<std::string> argv_strings;
  argv_strings.push_back(executable);
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  argv.reserve(argv_strings.size() + 1);
  for (auto& item : argv_strings) argv.push_back(item.data());
  argv.push_back(nullptr);
  std::vector<std::vector<char*>> envp(static_cast<size_t>(world));
  for (int rank = 0; rank < world; ++rank) {
    for (auto& item : child_env[static_cast<size_t>(rank)]) envp[static_cast<size_t>(rank)].push_back(item.data());
    envp[static_cast<size_t>(rank)].push_back(nullptr);
  }

  // Handlers only note the signal; the loop below forwards it (any thread may receive it).
  struct sigaction action {};
  action.sa_handler = remember_signal;
  sigemptyset(&action.sa_mask);
  struct sigaction old_term {
  }, old_int{};
  g_forward_signal.store(0);
  ::sigaction(SIGTERM, &action, &old_term);
  ::sigaction(SIGINT, &action, &old_int);

  std::vector<pid_t> pids(static_cast<size_t>(world), -1);
  std::vector<bool> running(static_cast<size_t>(world), false);
  const auto signal_all = [&](int signal_number) {
    for (int rank = 0; rank < world; ++rank) {
      if (running[static_cast<size_t>(rank)]) ::kill(pids[static_cast<size_t>(rank)], signal_number);
    }
  };
  int first_failure = 0;
  bool any_preempted = false;
  for (int rank = 0; rank < world; ++rank) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::setpgid(0, 0);
      struct sigaction default_action {};
      default_action.sa_handler = SIG_DFL;
      sigemptyset(&default_action.sa_mask);
      ::sigaction(SIGTERM, &default_action, nullptr);
      ::sigaction(SIGINT, &default_action, nullptr);
      ::execve(argv[0], argv.data(), envp[static_cast<size_t>(rank)].data());
      ::_exit(127);
    }
    if (pid < 0) {
      first_failure = 1;
      break;
    }
    pids[static_cast<size_t>(rank)] = pid;
    running[static_cast<size_t>(rank)] = true;
  }
  if (first_failure != 0) signal_all(SIGTERM);

  const auto start = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point kill_at = std::chrono::steady_clock::time_point::max();
  if (first_failure != 0) kill_at = start + options.failure_grace;
  if (options.timeout.count() > 0) kill_at = std::min(kill_at, start + options.timeout);
  bool timed_out = false;
  int alive = 0;
  for (bool flag : running) alive += flag ? 1 : 0;
  while (alive > 0) {
    const int forward = g_forward_signal.exchange(0);
    if (forward != 0) signal_all(forward);
    bool reaped = false;
    for (int rank = 0; rank < world; ++rank) {
      if (!running[static_cast<size_t>(rank)]) continue;
      int status = 0;
      const pid_t done = ::waitpid(pids[static_cast<size_t>(rank)], &status, WNOHANG);
      if (done == 0 || (done < 0 && errno == EINTR)) continue;
      running[static_cast<size_t>(rank)] = false;
      --alive;
      reaped = true;
      const int code = done < 0 ? 1 : exit_code_of(status);
      if (code == 75) {
        any_preempted = true;
      } else if (code != 0 && first_failure == 0) {
        // The others would wait in a collective until the timeout: ask them to stop now.
        first_failure = code;
        signal_all(SIGTERM);
        kill_at = std::min(kill_at, std::chrono::steady_clock::now() + options.failure_grace);
      }
    }
    if (reaped) continue;
    if (std::chrono::steady_clock::now() >= kill_at) {
      signal_all(SIGKILL);
      timed_out = first_failure == 0;
      kill_at = std::chrono::steady_clock::time_point::max();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }

  ::sigaction(SIGTERM, &old_term, nullptr);
  ::sigaction(SIGINT, &old_int, nullptr);
  if (first_failure != 0) return first_failure;
  if (timed_out) return 1;
  return any_preempted ? 75 : 0;
}

}  // namespace yolo8
