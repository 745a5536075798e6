// How a training run ends. Every way but the plain finish is in this file:
//   - finished: every epoch, or patience or time= reached at an epoch's end: finish() in train_run.cpp, exit 0;
//   - a stop request: SIGTERM or SIGINT (trainer/core/stop_signal.h; main installs the handlers, the set-up again),
//     the lease revoked or lost (TrainingLease::check in lease.cpp requests the stop), or time= reached inside an
//     epoch. Data-parallel ranks agree on it first. Before training the lease is given back, exit 75
//     (exit_before_training); inside an epoch last.pt is written at that step (stop_inside_epoch), at an epoch's
//     end its checkpoints are (stop_at_epoch_end); then the lease is released and the cost written, exit 75, or 0
//     for time= (exit_after_stop);
//   - quotad unreachable past quota_retry_s before training: exit 75, a later pod can start (set_up);
//   - a stop the set-up has not honoured within 2 s (a long trial step, a CUDA initialisation): its watchdog gives
//     the lease back and leaves with std::_Exit(75) (watch_set_up);
//   - a stop while the data loader delivers nothing (a read stuck on a hung filesystem): checkpointed where it can
//     be, then std::_Exit without the destructors (exit_while_stalled);
//   - an error: thrown to run_yolo8 (trainer/modes/mode_table.h): bad settings or data 2, anything else 1.
// The exit codes: common/exit_codes.h.

#include <cstdio>
#include <iomanip>
#include <iostream>
#include <thread>

#include "common/exit_codes.h"
#include "trainer/run/train_run.h"

namespace yolo8 {
using app::Clock;
using app::seconds_since;

// Every phase of the set-up honours the first SIGTERM (Kubernetes preempts a pod exactly then): the dataset check
// and the batch sizing poll it, the phases between check it, and the lease queue gives up its place.
std::optional<int> TrainingRun::set_up() {
  set_up_watchdog_ = std::thread([this] { watch_set_up(); });
  const auto end_watch = [this] {
    {
      std::lock_guard<std::mutex> lock(set_up_mutex_);
      set_up_done_ = true;
    }
    set_up_watchdog_.join();
  };
  try {
    std::optional<int> exit_code = set_up_phases();
    end_watch();
    return exit_code;
  } catch (const StoppedBeforeTraining& stopped) {
    end_watch();
    return exit_before_training(stopped.what());
  } catch (const StoppedWhileWaiting& stopped) {
    end_watch();
    return exit_before_training(stopped.what());
  } catch (const quota::QuotaUnavailable& unavailable) {
    // Retrying was the right answer until quota_retry_s: so is a later pod (resumable), not a failed Job.
    end_watch();
    console_->out() << "Stopped (" << to_string(StopReason::kQuotaUnreachable)
                    << ") before training: " << unavailable.what()
                    << " (quota_retry_s=" << settings_.lease.quota_retry_s << ")\n";
    return kExitPreempted;
  } catch (...) {
    end_watch();
    throw;
  }
}

void TrainingRun::watch_set_up() {
  constexpr double kSetUpStopGrace = 2.0;  // the phases' own checks usually answer well within it
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::lock_guard<std::mutex> lock(set_up_mutex_);
    if (set_up_done_) return;
    if (!stop_requested() || seconds_since_stop_request() < kSetUpStopGrace) continue;
    // The set-up holds no checkpoint and no file it could leave half-written: give the lease back and leave.
    if (lease_) lease_->release(quota::Outcome::kPreempted);
    std::fflush(stdout);
    std::fprintf(stderr, "yolo8: stopped (%s) before training, %.2f s after the stop request\n",
                 to_string(stop_reason()).c_str(), seconds_since_stop_request());
    std::_Exit(kExitPreempted);
  }
}

int TrainingRun::exit_before_training(const std::string& why) {
  if (lease_) lease_->release(quota::Outcome::kPreempted);
  console_->out() << "Stopped (" << to_string(stop_reason()) << ") before training: " << why << ", " << std::fixed
                  << std::setprecision(2) << seconds_since_stop_request() << " s after the stop request\n";
  return kExitPreempted;
}

int TrainingRun::stop_inside_epoch(int64_t epoch, int64_t i, int64_t ni) {
  const auto stop_start = Clock::now();
  save(last_pt_, epoch, i + 1, ni + 1, true, true);
  checkpoints_.wait();
  dist_.barrier();
  console_->out() << "Stopped (" << to_string(pending_stop_) << ") in epoch " << epoch + 1 << " after batch " << i + 1
                  << "; checkpoint " << last_pt_.string() << " written in " << std::fixed << std::setprecision(2)
                  << seconds_since(stop_start) << " s, " << seconds_since_stop_request()
                  << " s after the stop request. Resume with resume=" << last_pt_.string() << "\n";
  return exit_after_stop();
}

// The worker stuck in the read cannot be joined, so the process leaves from here without the destructors. The
// state after the last step is whole: one process checkpoints it as any stop inside the epoch would (none: the
// previous checkpoint is that state); data-parallel ranks stand in a collective the stalled rank never joins, so
// they leave without one and the last checkpoint stays valid.
void TrainingRun::exit_while_stalled(int64_t epoch, int64_t last_i) {
  pending_stop_ = stop_reason();
  console_->out() << "No batch from the data loader " << std::fixed << std::setprecision(2)
                  << seconds_since_stop_request() << " s after the stop request: a read does not return\n";
  const bool checkpoint = !dist_.enabled() && last_i >= 0;
  const int exit_code =
      checkpoint ? stop_inside_epoch(epoch, last_i, last_i + batches_per_epoch_ * epoch) : exit_after_stop();
  if (!checkpoint) console_->out() << "Stopped (" << to_string(pending_stop_) << ") in epoch " << epoch + 1 << "\n";
  std::cout.flush();
  std::fflush(stdout);
  std::_Exit(exit_code);
}

int TrainingRun::stop_at_epoch_end(int64_t epoch) {
  checkpoints_.wait();
  dist_.barrier();
  console_->out() << "Stopped (" << to_string(pending_stop_) << ") at the end of epoch " << epoch + 1 << "; checkpoint "
                  << last_pt_.string() << " written " << std::fixed << std::setprecision(2)
                  << seconds_since_stop_request() << " s after the stop request\n";
  return exit_after_stop();
}

int TrainingRun::exit_after_stop() {
  checkpoints_.wait();
  const bool timed_out = pending_stop_ == StopReason::kTimeLimit;
  lease_->release(timed_out ? quota::Outcome::kCompleted : quota::Outcome::kPreempted);
  report_cost(timed_out ? "completed" : "preempted");
  return timed_out ? kExitCompleted : kExitPreempted;
}

}  // namespace yolo8
