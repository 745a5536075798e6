#pragma once
// Building blocks shared by the dataset-driven modes (train in run/train_run.cpp; val and predict in modes/):
// the loader config, dataset splits, devices, validation passes. Needs OpenCV (data/).

#include <torch/torch.h>
#include <yaml-cpp/yaml.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/augment.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "models/yolo.h"
#include "trainer/cli/settings.h"
#include "trainer/detect/loss.h"
#include "trainer/detect/validator.h"
#include "trainer/support/model_loading.h"

namespace yolo8::app {

using Clock = std::chrono::steady_clock;

std::string yaml_text(const YAML::Node& node);
double seconds_since(Clock::time_point start);

// Plots must never stop a run: a failure is a warning.
void warn_plot_failed(const std::string& what, const std::exception& error);
template <typename Function>
void try_plot(const std::string& what, Function&& function) {
  try {
    function();
  } catch (const std::exception& error) {
    warn_plot_failed(what, error);
  }
}

torch::Device pick_device(const Settings& settings);

// The settings' loader config with this loader's batch and stride; validation loaders are rectangular and use
// every image.
// Who reads the loader: the training loop, the validation inside a training run, or `yolo8 val`.
enum class LoaderRole { kTrain, kTrainingValidation, kValidation };
// `device` is where the batches go: only a CUDA device gets pinned batches.
data::LoaderConfig loader_config(const Settings& settings, int batch, int stride, LoaderRole role,
                                 const torch::Device& device);
// The split's index, with its report when `verbose`; throws DataError when no image is usable.
std::shared_ptr<const data::DatasetIndex> load_split(const data::DatasetSpec& spec, const std::string& split,
                                                     const Settings& settings, bool verbose);

// Each image's original size and letterbox mapping, as the validator takes them.
std::vector<ImageGeometry> batch_geometry(const data::Batch& batch);

// A batch of B×3×H×W uint8 images as the model's float input on `device`, x / 255, channels-last when asked: the
// values of .to(kFloat).div_(255) then .contiguous(ChannelsLast), converted straight into the final layout.
torch::Tensor model_input(const torch::Tensor& images, const torch::Device& device, bool channels_last);

// Where a validation pass spent its time, on the thread that runs the model (seconds, all batches).
struct ValidationTimes {
  int64_t images = 0;
  double waiting = 0;      // for the loader's next batch (decode and letterbox that its workers had not finished)
  double preprocess = 0;   // model_input
  double inference = 0;    // the forward pass
  double postprocess = 0;  // NMS, mapping to the original images, metrics, the validation loss
  // "0.1 ms waiting for data, 0.9 ms preprocess, 88.0 ms inference, 3.1 ms postprocess per image"
  std::string per_image() const;
};

// Runs a model (eval mode) over a loader; `loss` adds the validation loss when given; `plot_dir` (when not
// empty) receives the first batch's labels and predictions as mosaics. `half`: the forward pass under autocast
// where it applies (autocast.h): float16 on CUDA, bfloat16 on a CPU with native bfloat16, where Detect's output
// convolutions stay float32 (detect.h); NMS and metrics stay float32.
ValidationTimes run_validation(DetectionModel& model, data::DataLoader& loader, DetectionValidator& validator,
                               const DetectionLoss* loss, const torch::Device& device, bool channels_last, bool half,
                               const std::string& prefix, const std::filesystem::path& plot_dir = {},
                               const std::vector<std::string>& names = {});

void write_text(const std::filesystem::path& path, const std::string& text);

}  // namespace yolo8::app
