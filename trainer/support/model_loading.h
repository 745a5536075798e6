#pragma once
// Weights for every mode from whatever the user names (a yolo8 training checkpoint, an Ultralytics `.pt`, a
// state-dict file, a model YAML), the metadata a training checkpoint carries, and the resume decision. No OpenCV.

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "models/weights.h"
#include "models/yolo.h"
#include "trainer/cli/settings.h"
#include "trainer/core/checkpoint.h"

namespace yolo8 {

// A problem with the user's data or weights: main() exits 2, retrying will not help.
class DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Model weights from a yolo8 checkpoint (last.pt / best.pt: the EMA weights), an Ultralytics `.pt`, a
// state-dict file or a model YAML (fresh weights).
LoadedModel load_any_model(const std::string& spec, int64_t nc_override = 0);

// Loaded weights made ready for inference (val, predict, a run's final validation of best.pt): on `device`, in eval
// mode, BN folded into the convolutions, as Ultralytics' AutoBackend(fuse=True) loads weights. A training run's
// per-epoch validation takes the EMA model as it is, as Ultralytics' does.
void prepare_for_inference(DetectionModel& model, const torch::Device& device);

// True when `path` is a checkpoint written by yolo8's trainer.
bool is_training_checkpoint(const std::string& path);

// The checkpoint a `resume` setting points at ("" when the run starts fresh); throws when resume=true or a
// path finds nothing resumable.
std::string resolve_resume_checkpoint(const Settings& settings);

// The training arguments a weights file carries, as setting text (lists as a,b): a yolo8 checkpoint's settings,
// an Ultralytics `.pt`'s train_args; empty for a YAML, a state-dict file or anything else.
std::map<std::string, std::string> training_arguments(const std::string& path);

namespace app {

// Setup failures (data, weights, checkpoints) are the user's to fix: exit 2, not 1. Only failures that say the
// input is wrong become a DataError; what a retry can cure stays as it is (exit 1, which a Job retries): memory
// exhausted (std::bad_alloc, a CUDA out-of-memory), a GPU fault, a system call's error (an NFS read, EIO), and a
// logic_error that is not about an argument (a bug, not the user's file).
bool is_input_failure(const std::exception& error);
template <typename Function>
auto as_input_error(Function&& function) -> decltype(function()) {
  try {
    return function();
  } catch (const SettingsError&) {
    throw;
  } catch (const DataError&) {
    throw;
  } catch (const std::exception& error) {
    if (!is_input_failure(error)) throw;
    throw DataError(error.what());
  }
}

// What a training checkpoint stores besides tensors (as JSON in its settings text).
struct CheckpointMeta {
  std::string settings_yaml;
  std::string model_yaml;
  std::vector<std::string> names;
  std::string run_dir;
  // Written, not stored in the settings text: the run's arguments in Ultralytics' form (args.yaml's text), for the
  // checkpoint's train_args. Empty (a checkpoint read back): the settings above.
  std::string ultralytics_args_yaml;
};
std::string encode_meta(const CheckpointMeta& meta);
CheckpointMeta decode_meta(const std::string& text, const std::string& path);
DetectionModel model_from_meta(const CheckpointMeta& meta, const std::string& source, int64_t nc_override = 0);
// The checkpoint's train_args, a flat YAML mapping: Ultralytics' YOLO(path) takes imgsz, data, task and single_cls
// from it and ignores keys it does not know. The run's arguments in Ultralytics' form (as args.yaml), no secret.
std::string ultralytics_train_args_yaml(const CheckpointMeta& meta);
// What a checkpoint needs to open in Ultralytics' YOLO(): architecture, names, train_args.
UltralyticsView ultralytics_view(const CheckpointMeta& meta);

// Copies every tensor whose name and shape match; returns how many.
size_t transfer_matching(torch::nn::Module& module, const std::map<std::string, torch::Tensor>& source);
std::map<std::string, torch::Tensor> as_map(const NamedTensors& tensors);
}  // namespace app
}  // namespace yolo8
