#pragma once
// Batch size from the memory budget: profile a few small batches, fit the memory model, predict the
// largest batch that fits, verify it with a real step, and fall back by halving on out-of-memory.
// Works on step callbacks only, so it knows nothing of the model, the loss or the data.

#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "trainer/core/memory_meter.h"
#include "trainer/core/memory_model.h"

namespace yolo8 {

// Runs one step at `batch` and returns its measured peak bytes (see measure_peak_bytes); throws
// (OutOfMemory, a c10 out-of-memory error) when the step does not fit. Must be repeatable: the
// auto-batch calls it several times at different batches.
using StepFn = std::function<int64_t(int batch)>;

// Resets the meter's peak, runs `fn`, returns the peak bytes seen during it.
int64_t measure_peak_bytes(MemoryMeter& meter, const std::function<void()>& fn);

// The `batch` setting: >= 1 a fixed batch, -1 auto on the full budget, 0 < x < 1 auto on that
// fraction of the budget.
struct BatchSpec {
  bool automatic = false;
  double budget_fraction = 1.0;  // when automatic
  int fixed_batch = 0;           // when not automatic
};
// Throws std::invalid_argument naming the key `batch` for any other value (0, -2, 2.5 ...).
BatchSpec parse_batch_spec(double batch);

struct AutoBatchOptions {
  double safety_margin = 0.9;                 // predicted peak <= budget · fraction · margin
  double budget_fraction = 1.0;               // from BatchSpec
  std::vector<int> profile_batches{1, 2, 4};  // increasing
  int max_batch = 1024;                       // e.g. the dataset size
  int nominal_batch = 64;                     // `nbs`: the result's accumulate is plan_batch's
  int max_verify_steps = 4;                   // real steps after profiling, up or down
  // Optional forward-only validation step; called at validation_batch_factor · b, its peak counts too.
  StepFn validation_step;
  int validation_batch_factor = 2;
  int imgsz = 640;  // recorded in the fit; the steps run at whatever size they were built for
  c10::Device device = c10::Device(c10::kCPU);  // its CUDA cache is emptied after an out-of-memory
  std::function<void(const std::string&)> log;  // progress lines; none when empty
};

struct AutoBatchResult {
  int batch = 0;
  int accumulate = 1;
  double budget_bytes = 0.0;          // budget · fraction, the limit the verified peak respects
  double predicted_peak_bytes = 0.0;  // model's prediction for `batch` (train and validation)
  int64_t measured_peak_bytes = 0;    // verified: max of the train step and the validation step
  MemoryFit fit;                      // from all measured samples
  std::vector<MemorySample> train_samples;
  std::vector<MemorySample> validation_samples;
  int steps_down = 0;  // verification steps that failed (over budget or out of memory)
};

// Picks the largest batch whose measured peak fits the budget, as described above. Throws
// OutOfMemory when not even batch 1 fits; std::invalid_argument on bad options or budget.
AutoBatchResult choose_batch(const StepFn& step, double budget_bytes, const AutoBatchOptions& options = {});

// One line for the run log: budget, batch, accumulation, predicted and measured peak.
std::string format_auto_batch_summary(const AutoBatchResult& result);

// The out-of-memory fallback of a training step: when a step runs out of memory it is retried in twice as many
// passes (half the images each; the batch, and so the recipe, stays) down to one image per pass, then the error
// is rethrown. The split is kept between calls, so one guard covers every step of an epoch. TrainingCore's
// guarded_step is the trainer's use of it.
class OomGuard {
 public:
  // Called on each split with the images per pass before and after, and the error's first line.
  using Report = std::function<void(int64_t from_images, int64_t to_images, const std::string& error)>;

  // An empty report prints one line per split to stderr.
  explicit OomGuard(c10::Device device = c10::Device(c10::kCPU), Report report = {});

  // Runs fn(passes()) for a batch of `images` until it returns. Before each retry `undo` (when given) puts back
  // what the failed attempt changed, e.g. the accumulated gradients. Other errors pass through untouched.
  void run(int64_t images, const std::function<void(int64_t passes)>& fn, const std::function<void()>& undo = {});

  int64_t passes() const { return passes_; }
  int splits() const { return splits_; }

 private:
  int64_t passes_ = 1;
  int splits_ = 0;
  c10::Device device_;
  Report report_;
};

// --- Profiler: peak memory and speed of a step at several batches (`yolo8 profile`). ---

struct ProfileOptions {
  int warmup_steps = 1;  // untimed, but their peak counts (the first step creates optimizer state)
  int timed_steps = 3;
  bool stop_at_out_of_memory = true;  // skip larger batches after the first that does not fit
  // The process's device memory as the driver counts it (nvidia-smi: CUDA context, library workspaces and the
  // allocator's cache), read after each row's steps; none, or < 0, where unknown.
  std::function<int64_t()> process_bytes;
};

struct StepProfile {
  int batch = 0;
  int imgsz = 0;
  bool out_of_memory = false;
  int64_t peak_bytes = 0;           // tensor memory (CUDA: allocated) peak over all steps at this batch
  int64_t reserved_peak_bytes = 0;  // CUDA: the caching allocator's reserved peak; CPU: = peak_bytes
  double step_seconds = 0.0;        // median over the timed steps
  double images_per_second = 0.0;
  int64_t process_bytes = -1;           // ProfileOptions::process_bytes after the steps; -1 unknown
  int64_t process_overhead_bytes = -1;  // process_bytes less what the allocator held then: what no cap covers
};

// Runs `step(batch)` warmup + timed times for each batch; CUDA work is synchronised before each
// clock read. Non-out-of-memory errors propagate.
std::vector<StepProfile> profile_steps(MemoryMeter& meter, const std::function<void(int batch)>& step,
                                       const std::vector<int>& batches, int imgsz, const ProfileOptions& options = {});

// Linear fit of the rows that fit in memory (at least one needed), at the rows' imgsz.
MemoryFit fit_profile(const std::vector<StepProfile>& rows);

// Fixed-width text table: batch, peak and reserved GiB, ms/step, images/s.
std::string format_profile_table(const std::string& variant, const std::vector<StepProfile>& rows);

// JSON text: {"variant", "imgsz", "device", "rows": [{batch, out_of_memory, peak_bytes, ...}],
// "fit": {"fixed_gib", "per_image_gib", "reference_imgsz"}} (fit omitted when no row fits).
std::string profile_json(const std::string& variant, const std::string& device, const std::vector<StepProfile>& rows);

}  // namespace yolo8
