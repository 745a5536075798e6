#pragma once
// One `yolo8 train` run in four parts: set-up (resume, data, model, lease, batch, data parallelism, loaders,
// training core), the epochs, the end of each epoch (validation, fitness, results, checkpoints, stop rules)
// and the finish (final validation of best.pt, cost, lease release). Built only with OpenCV.

#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "data/dataset.h"
#include "data/loader.h"
#include "models/yolo.h"
#include "trainer/cli/settings.h"
#include "trainer/core/auto_batch.h"
#include "trainer/core/checkpoint_writer.h"
#include "trainer/core/distributed.h"
#include "trainer/core/memory_meter.h"
#include "trainer/core/stop_signal.h"
#include "trainer/core/train_step.h"
#include "trainer/run/lease.h"
#include "trainer/runtime/console.h"
#include "trainer/runtime/progress.h"
#include "trainer/runtime/run_dir.h"
#include "trainer/support/mode_support.h"

namespace yolo8 {

// How a caller drives a run beyond its settings.
struct TrainingRunOptions {
  // >= 0: stop as SIGTERM would once this many global iterations are done (checkpoint, exit kExitPreempted).
  int64_t stop_at_iteration = -1;
};

class TrainingRun {
 public:
  explicit TrainingRun(const Settings& requested, TrainingRunOptions options = {});
  ~TrainingRun();
  TrainingRun(const TrainingRun&) = delete;
  TrainingRun& operator=(const TrainingRun&) = delete;

  // The exit code of `yolo8 train` (kExitCompleted, kExitPreempted); setup problems throw as run_train does.
  int run();

 private:
  // What one epoch's steps leave for its end.
  struct EpochTotals {
    torch::Tensor loss_sum = torch::zeros({3}, torch::kDouble);
    int64_t loss_count = 0;
    std::vector<double> learning_rates;  // the three groups, before the scheduler step
  };
  struct EpochEnd {
    std::optional<int> exit_code;  // stopped by a signal or the time limit: exit now
    bool stop_training = false;    // patience or time limit: go to the finish
  };

  // Set-up; an exit code when there is nothing to train or a stop came first.
  std::optional<int> set_up();
  std::optional<int> set_up_phases();
  // Releases the lease (if held) as preempted; kExitPreempted.
  int exit_before_training(const std::string& why);
  // A stop request the set-up has not honoured within kSetUpStopGrace (a long trial step, a CUDA initialisation)
  // ends the process from this thread: lease released, exit 75. Runs until the set-up ends.
  void watch_set_up();
  void adopt_resumed_settings();
  void load_datasets();
  void build_models();
  void acquire_lease();
  void size_batch();
  void open_run_dir();
  void create_loaders();
  void build_training_core();
  std::optional<int> restore_checkpoint();
  void prepare_outputs();

  // The epochs; an exit code when a stop inside the epoch ended the run.
  std::optional<int> train_epoch(int64_t epoch, EpochTotals& totals);
  void record_step_and_agree_on_stop(int64_t epoch, int64_t ni);
  int stop_inside_epoch(int64_t epoch, int64_t i, int64_t ni);
  // A stop request while the loader delivers nothing (a read stuck on a hung filesystem): after step `last_i` of
  // `epoch` (-1: none in this epoch), checkpointed as a stop inside the epoch; the process then leaves.
  [[noreturn]] void exit_while_stalled(int64_t epoch, int64_t last_i);

  // The end of an epoch.
  EpochEnd end_epoch(int64_t epoch, const EpochTotals& totals);
  void validate_epoch(bool final_epoch, DetectionResults& metrics, std::vector<double>& val_loss);
  void save_epoch_checkpoints(int64_t epoch, bool improved);
  int stop_at_epoch_end(int64_t epoch);

  // The finish.
  int finish();

  void save(const std::filesystem::path& path, int64_t epoch, int64_t iteration_in_epoch, int64_t global_iteration,
            bool with_optimizer, bool with_grads);
  void note_checkpoint_written();
  void report_cost(const std::string& outcome);
  // Releases the lease and writes the cost for a signal or time-limit stop; returns the exit code.
  int exit_after_stop();

  // Declared in the order the set-up creates them, so they are destroyed as the single function did.
  TrainingRunOptions options_;
  std::mutex set_up_mutex_;  // guards lease_ and set_up_done_ between the set-up and its watchdog
  bool set_up_done_ = false;
  std::thread set_up_watchdog_;
  app::Clock::time_point run_start_;
  std::unique_ptr<Console> console_;  // quiet on ranks other than 0
  Settings requested_;
  Settings settings_;
  std::string resume_path_;
  app::CheckpointMeta resume_meta_;
  OptimizerChoice resumed_optimizer_;  // the checkpoint's resolved optimizer (empty name: none stored)
  std::filesystem::path run_dir_;
  torch::Device device_ = torch::kCPU;
  DistributedContext dist_;
  bool is_main_ = true;
  bool encode_in_background_ = false;  // checkpoints encoded on the writer's thread (threads.h)
  double lease_gib_ = 0.0;             // memory per GPU granted by the quota service (0: none)
  data::DatasetSpec spec_;
  std::vector<std::string> names_;
  int64_t nc_ = 0;
  std::shared_ptr<const data::DatasetIndex> train_index_;
  std::shared_ptr<const data::DatasetIndex> val_index_;
  DetectionModel model_{nullptr};
  DetectionModel ema_model_{nullptr};
  int stride_ = 32;
  std::unique_ptr<TrainingLease> lease_;
  int batch_ = 0;        // global
  int local_batch_ = 0;  // this process's share
  std::unique_ptr<data::DataLoader> train_loader_;
  std::unique_ptr<data::DataLoader> val_loader_;
  int64_t batches_per_epoch_ = 0;
  std::unique_ptr<TrainingCore> core_;
  app::CheckpointMeta meta_;
  int64_t start_epoch_ = 0;
  int64_t first_batch_ = 0;
  double best_fitness_ = 0.0;
  bool has_best_ = false;
  std::unique_ptr<ResultsCsv> results_;
  std::filesystem::path last_pt_;
  std::filesystem::path best_pt_;
  std::unique_ptr<OomGuard> oom_guard_;  // passes per batch; grows only when a first-epoch step runs out of memory
  StopReason pending_stop_ = StopReason::kNone;
  int epochs_without_improvement_ = 0;
  double time_limit_s_ = 0.0;
  double images_seen_ = 0;
  double train_seconds_ = 0;
  double busy_seconds_ = 0;  // inside training steps
  app::Clock::time_point train_start_;
  std::unique_ptr<MemoryMeter> run_meter_;  // peak tensor memory of the run (CUDA allocator or the CPU counter)
  // Data parallel on GPUs: this rank's own device in NVML, read at each combination of the ranks' telemetry so
  // that rank 0's heartbeat reports every rank's device; null on CPU, in one process, or without NVML.
  std::unique_ptr<Nvml> rank_nvml_;
  std::string rank_nvml_device_;
  // Checkpoints go to disk on this writer's thread; the run waits for it where a file must be there. Last, so that
  // it is the first destroyed: its callback reads lease_.
  CheckpointWriter checkpoints_{[this](const std::string&) { note_checkpoint_written(); }};
};

// `yolo8 train` in this process: TrainingRun(settings).run().
int run_train(const Settings& settings);

}  // namespace yolo8
