#pragma once
// Why and when a run must yield: SIGTERM/SIGINT, a revoked lease, an unreachable quota service, a time limit.
// Set from signal handlers and the heartbeat thread, read by the training loop at each step boundary.

#include <stdexcept>
#include <string>

namespace yolo8 {

enum class StopReason { kNone = 0, kSignal, kLeaseRevoked, kQuotaUnreachable, kTimeLimit };

std::string to_string(StopReason reason);

// Installs SIGTERM and SIGINT handlers (idempotent). The first signal asks for a stop at the next step
// boundary; a second one also skips work that is not needed to resume (validation, plots); a third exits
// at once with code 75, which is safe because checkpoints are replaced atomically.
void install_stop_signal_handlers();

// Asks for a stop (the first reason wins).
void request_stop(StopReason reason);

bool stop_requested();
StopReason stop_reason();
int stop_signal_count();  // signals received since the last reset

// Seconds since the first stop request (signal or otherwise); negative when none.
double seconds_since_stop_request();

// True after a second signal: skip everything but the checkpoint.
bool stop_is_urgent();

// A stop was requested before training began (dataset check, lease queue, batch sizing): there is nothing to
// checkpoint, so the run gives up its lease and exits kExitPreempted at once.
class StoppedBeforeTraining : public std::runtime_error {
 public:
  explicit StoppedBeforeTraining(const std::string& phase) : std::runtime_error("stopped while " + phase) {}
};

// Throws StoppedBeforeTraining naming `phase` ("sizing the batch") when a stop was requested.
void throw_if_stop_requested(const std::string& phase);

// Only for tests and for a process that starts a new run.
void reset_stop_state();

}  // namespace yolo8
