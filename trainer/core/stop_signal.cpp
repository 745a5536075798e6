#include "trainer/core/stop_signal.h"

#include <time.h>
#include <unistd.h>

#include <atomic>
#include <csignal>

#include "common/exit_codes.h"

namespace yolo8 {
namespace {

// Lock-free atomics: the only state a signal handler may touch.
std::atomic<int> g_reason{static_cast<int>(StopReason::kNone)};
std::atomic<int> g_signals{0};
std::atomic<int64_t> g_request_ns{-1};  // CLOCK_MONOTONIC of the first request
static_assert(std::atomic<int>::is_always_lock_free);
static_assert(std::atomic<int64_t>::is_always_lock_free);

int64_t monotonic_ns() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);  // async-signal-safe
  return static_cast<int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec;
}

void note_request_time() {
  int64_t expected = -1;
  g_request_ns.compare_exchange_strong(expected, monotonic_ns());
}

extern "C" void on_stop_signal(int /*signal_number*/) {
  const int count = g_signals.fetch_add(1) + 1;
  note_request_time();
  int expected = static_cast<int>(StopReason::kNone);
  g_reason.compare_exchange_strong(expected, static_cast<int>(StopReason::kSignal));
  if (count >= 3) {
    static const char kMessage[] = "yolo8: third signal, exiting now; the last checkpoint stays valid\n";
    [[maybe_unused]] const auto written = write(STDERR_FILENO, kMessage, sizeof(kMessage) - 1);
    _exit(kExitPreempted);
  }
}

}  // namespace

std::string to_string(StopReason reason) {
  switch (reason) {
    case StopReason::kNone: return "none";
    case StopReason::kSignal: return "signal";
    case StopReason::kLeaseRevoked: return "lease revoked";
    case StopReason::kQuotaUnreachable: return "quota service unreachable";
    case StopReason::kTimeLimit: return "time limit";
  }
  return "unknown";
}

void install_stop_signal_handlers() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // a signal must not turn a checkpoint write() into an error
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
}

void request_stop(StopReason reason) {
  note_request_time();
  int expected = static_cast<int>(StopReason::kNone);
  g_reason.compare_exchange_strong(expected, static_cast<int>(reason));
}

bool stop_requested() { return g_reason.load() != static_cast<int>(StopReason::kNone); }

StopReason stop_reason() { return static_cast<StopReason>(g_reason.load()); }

int stop_signal_count() { return g_signals.load(); }

bool stop_is_urgent() { return g_signals.load() >= 2; }

double seconds_since_stop_request() {
  const int64_t requested = g_request_ns.load();
  return requested < 0 ? -1.0 : static_cast<double>(monotonic_ns() - requested) / 1e9;
}

void throw_if_stop_requested(const std::string& phase) {
  if (stop_requested()) throw StoppedBeforeTraining(phase);
}

void reset_stop_state() {
  g_request_ns.store(-1);
  g_reason.store(static_cast<int>(StopReason::kNone));
  g_signals.store(0);
}

}  // namespace yolo8
