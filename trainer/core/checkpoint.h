#pragma once
// Training checkpoints: everything needed to continue a run exactly, written atomically.
//
// File format (format_version 2): a torch.save zip whose pickle is the dict Ultralytics' YOLO(path) loads (model and
// ema as ultralytics.nn.tasks.DetectionModel objects, epoch, best_fitness, optimizer None, updates, train_args, date,
// version) with our own state under the key `yolo8`, which Ultralytics ignores. The model objects are not stored
// attribute by attribute: the pickle calls DetectionModel(yaml, 3, nc, False), sets `names`, then
// Module.load_state_dict on the very tensors of our state, so each tensor is in the file once (see README,
// "Ultralytics"). Our state is the dict format_version 1 held at the top level (a `torch::pickle_save` zip), which
// still loads: format/format_version, model / ema / grads (name -> tensor dicts under state-dict names),
// ema_updates, optimizer (uint8 bytes of LibTorch's own optimizer archive), optimizer_type and optimizer_choice,
// state (counters), settings, rng_* entries, date, version; grad_scaler (scale, growth_tracker) only for
// mixed-precision runs, so files written before it existed still load. The data loader keeps no state of its
// own: its order follows the seed and the epoch, its position is iteration_in_epoch (an empty `loader_state`
// in older files is ignored).

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "trainer/core/ema.h"
#include "trainer/core/grad_scaler.h"
#include "trainer/core/rng_state.h"
#include "trainer/core/schedule.h"

namespace yolo8 {

inline constexpr const char* kCheckpointFormat = "yolo8-train-checkpoint";
inline constexpr int64_t kCheckpointFormatVersion = 2;  // 1 (no Ultralytics keys) still loads

struct CheckpointState {
  int64_t epoch = 0;                 // epoch in progress
  int64_t iteration_in_epoch = 0;    // batches of `epoch` already done (0 at an epoch boundary)
  int64_t global_iteration = 0;      // global index of the next iteration
  int64_t batch = 0;                 // batch size the run used
  ScheduleState schedule;            // scheduler epoch, accumulate, last optimizer step, optimizer steps
  OptimizerChoice optimizer_choice;  // `auto` resolved once; a resume reuses it (see build_optimizer_with)
  double best_fitness = 0.0;
  bool has_best_fitness = false;
  std::string settings_text;  // the run settings as YAML or JSON text
  RngState rng;
  bool has_grad_scaler = false;  // mixed precision: the loss scale and its growth counter continue on resume
  GradScalerState grad_scaler;
  std::string date;     // written by save_checkpoint (UTC, ISO 8601)
  std::string version;  // written by save_checkpoint (project version)
};

// What Ultralytics needs to rebuild its model object when it loads the file. An empty model_yaml writes no
// Ultralytics keys (the file then loads only here).
struct UltralyticsView {
  std::string model_yaml;          // the architecture as Ultralytics' DetectionModel takes it (scale and nc set)
  std::vector<std::string> names;  // class names, index order
  std::string train_args_yaml;     // a flat mapping of the run settings: the checkpoint's train_args
};

struct CheckpointSources {
  const torch::nn::Module* model = nullptr;            // required
  const ModelEma* ema = nullptr;                       // optional
  const torch::optim::Optimizer* optimizer = nullptr;  // optional
  bool include_grads = false;                          // store accumulated gradients (mid-accumulation checkpoints)
  UltralyticsView ultralytics{};                       // optional: makes the file open in Ultralytics' YOLO()
};

struct CheckpointTargets {
  torch::nn::Module* model = nullptr;            // optional: weights copied in (names and shapes must match)
  ModelEma* ema = nullptr;                       // optional: EMA weights and updates
  torch::optim::Optimizer* optimizer = nullptr;  // optional: same type and param-group layout required
  bool load_grads = true;                        // restore stored gradients into `model` when present
  torch::Device device = torch::kCPU;            // where optimizer state tensors are placed
};

// Serialises to bytes (the file content) and back.
std::vector<char> encode_checkpoint(const CheckpointState& state, const CheckpointSources& sources);

// encode_checkpoint in two halves, so that a run encodes on another thread while it trains on: the snapshot copies
// what the file stores out of the training objects as they are now (every tensor, the optimizer's archive), and
// encoding it reads nothing else. encode_snapshot(snapshot_checkpoint(s, x)) gives encode_checkpoint(s, x)'s bytes.
struct CheckpointSnapshot {
  CheckpointState state;
  c10::impl::GenericDict root{c10::StringType::get(), c10::AnyType::get()};  // the `yolo8` dict, checksum aside
  UltralyticsView ultralytics;
};
CheckpointSnapshot snapshot_checkpoint(const CheckpointState& state, const CheckpointSources& sources);
std::vector<char> encode_snapshot(const CheckpointSnapshot& snapshot);
CheckpointState decode_checkpoint(const std::vector<char>& bytes, const CheckpointTargets& targets,
                                  const std::string& origin = "<memory>");

// Atomic save: temporary file in the same folder, write, fsync, rename over `path`, fsync the folder. A crash at
// any point leaves either the previous file or the new one at `path`. Stale temporaries of dead writers are removed.
void save_checkpoint(const std::string& path, const CheckpointState& state, const CheckpointSources& sources);
// Loads and validates; every failure is a std::runtime_error whose one-line message names the file.
CheckpointState load_checkpoint(const std::string& path, const CheckpointTargets& targets = {});
// True when `path` loads (without touching any model); `error` gets the reason otherwise.
bool checkpoint_readable(const std::string& path, std::string* error = nullptr);

}  // namespace yolo8
