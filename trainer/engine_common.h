#pragma once
// Building blocks shared by the dataset-driven modes (train in train_run.cpp; val, predict in engine.cpp):
// settings to loader / augmentation configs, dataset splits, devices and threads, validation passes and the
// metadata a training checkpoint carries. Compiled only with OpenCV (YOLO8_HAVE_DATA).

#include <torch/torch.h>
#include <yaml-cpp/yaml.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "data/augment.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "models/weights.h"
#include "models/yolo.h"
#include "trainer/engine.h"
#include "trainer/loss.h"
#include "trainer/settings.h"
#include "trainer/threads.h"
#include "trainer/validator.h"

namespace yolo8::engine {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string yaml_text(const YAML::Node& node);
double seconds_since(Clock::time_point start);

// Setup failures (data, weights, checkpoints) are the user's to fix: exit 2, not 1.
template <typename Function>
auto as_input_error(Function&& function) -> decltype(function()) {
  try {
    return function();
  } catch (const SettingsError&) {
    throw;
  } catch (const DataError&) {
    throw;
  } catch (const std::exception& error) {
    throw DataError(error.what());
  }
}

// Plots must never stop a run: a failure is a warning.
template <typename Function>
void try_plot(const std::string& what, Function&& function) {
  try {
    function();
  } catch (const std::exception& error) {
    std::cerr << "warning: could not plot " << what << ": " << error.what() << "\n";
  }
}

torch::Device pick_device(const Settings& settings);

data::LoaderConfig loader_config(const Settings& settings, int batch, int stride, bool train);
data::AugmentConfig augment_config(const Settings& settings);
// The split's index, with its report when `verbose`; throws DataError when no image is usable.
std::shared_ptr<const data::DatasetIndex> load_split(const data::DatasetSpec& spec, const std::string& split,
                                                     const Settings& settings, bool verbose);

// Runs a model (eval mode) over a loader; `loss` adds the validation loss when given; `plot_dir` (when not
// empty) receives the first batch's labels and predictions as mosaics. `half`: the forward pass under CUDA
// autocast (the reference validates in half precision on GPUs); NMS and metrics stay float32.
void run_validation(DetectionModel& model, data::DataLoader& loader, DetectionValidator& validator,
                    const DetectionLoss* loss, const torch::Device& device, bool channels_last, bool half,
                    const std::string& prefix, const fs::path& plot_dir = {},
                    const std::vector<std::string>& names = {});

// What a training checkpoint stores besides tensors (as JSON in its settings text).
struct CheckpointMeta {
  std::string settings_yaml;
  std::string model_yaml;
  std::vector<std::string> names;
  std::string run_dir;
};
std::string encode_meta(const CheckpointMeta& meta);
CheckpointMeta decode_meta(const std::string& text, const std::string& path);
DetectionModel model_from_meta(const CheckpointMeta& meta, const std::string& source, int64_t nc_override = 0);

// Copies every tensor whose name and shape match; returns how many.
size_t transfer_matching(torch::nn::Module& module, const std::map<std::string, torch::Tensor>& source);
std::map<std::string, torch::Tensor> as_map(const NamedTensors& tensors);
void write_text(const fs::path& path, const std::string& text);

}  // namespace yolo8::engine
