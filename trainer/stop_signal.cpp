#include "trainer/stop_signal.h"

#include <unistd.h>

#include <atomic>
#include <csignal>

#include "trainer/exit_codes.h"

namespace yolo8 {
namespace {

// Lock-free atomics: the only state a signal handler may touch.
std::atomic<int> g_reason{static_cast<int>(StopReason::kNone)};
std::atomic<int> g_signals{0};
static_assert(std::atomic<int>::is_always_lock_free);

extern "C" void on_stop_signal(int /*signal_number*/) {
  const int count = g_signals.fetch_add(1) + 1;
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
  int expected = static_cast<int>(StopReason::kNone);
  g_reason.compare_exchange_strong(expected, static_cast<int>(reason));
}

bool stop_requested() { return g_reason.load() != static_cast<int>(StopReason::kNone); }

StopReason stop_reason() { return static_cast<StopReason>(g_reason.load()); }

int stop_signal_count() { return g_signals.load(); }

bool stop_is_urgent() { return g_signals.load() >= 2; }

void reset_stop_state() {
  g_reason.store(static_cast<int>(StopReason::kNone));
  g_signals.store(0);
}

}  // namespace yolo8
