// Helpers shared by the dataset-driven modes (train, val, predict). Built only with OpenCV.

#include "trainer/support/mode_support.h"

#include <nlohmann/json.hpp>
#ifdef YOLO8_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

#include <fstream>
#include <iomanip>
#include <iostream>
#include <optional>
#include <sstream>
#include <thread>

#include "trainer/core/autocast.h"
#include "trainer/core/stop_signal.h"
#include "trainer/plots/plots.h"
#include "trainer/runtime/progress.h"
#include "trainer/runtime/threads.h"

namespace yolo8::app {
namespace fs = std::filesystem;
std::vector<ImageGeometry> batch_geometry(const data::Batch& batch) {
  std::vector<ImageGeometry> geometry;
  const torch::Tensor ratio_pad = batch.ratio_pad.to(torch::kDouble).contiguous();
  const auto rows = ratio_pad.accessor<double, 2>();
  for (size_t i = 0; i < batch.orig_shapes.size(); ++i) {
    geometry.push_back(
        {batch.orig_shapes[i].first, batch.orig_shapes[i].second, rows[i][0], rows[i][1], rows[i][2], rows[i][3]});
  }
  return geometry;
}

std::string yaml_text(const YAML::Node& node) {
  YAML::Emitter emitter;
  emitter << node;
  return emitter.c_str();
}

void warn_plot_failed(const std::string& what, const std::exception& error) {
  std::cerr << "warning: could not plot " << what << ": " << error.what() << "\n";
}

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

torch::Device pick_device(const Settings& settings) {
  const std::vector<int> ids = settings.device_ids();
#ifdef YOLO8_WITH_CUDA
  if (ids.size() > 1) {
    // One process per GPU (launched by yolo8 itself, torchrun or an indexed Job): LOCAL_RANK picks the GPU.
    const char* local_rank = std::getenv("LOCAL_RANK");
    const size_t index = local_rank ? static_cast<size_t>(std::atoi(local_rank)) : 0;
    if (index >= ids.size()) {
      throw SettingsError("LOCAL_RANK " + std::to_string(index) + " has no GPU in device=" + settings.device);
    }
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(ids[index]));  // NCCL needs the current device set
    return torch::Device(torch::kCUDA, ids[index]);
  }
  if (!ids.empty()) return torch::Device(torch::kCUDA, ids.front());
  if (settings.device.empty() && torch::cuda::is_available()) return torch::Device(torch::kCUDA, 0);
#else
  if (!ids.empty()) {
    throw SettingsError("setting 'device' asks for GPU " + settings.device +
                        " but this yolo8 was built with a CPU-only LibTorch; use device=cpu");
  }
#endif
  return torch::kCPU;
}

data::LoaderConfig loader_config(const Settings& settings, int batch, int stride, LoaderRole role,
                                 const torch::Device& device) {
  data::LoaderConfig config = settings.loader;
  config.pin_memory = device.is_cuda();
  config.workers = loader_workers(config.workers, current_cpu_share());
  config.batch = batch;
  config.stride = stride;
  config.shuffle = role == LoaderRole::kTrain;
  if (role != LoaderRole::kTrain) config.fraction = 1.0;
  // The reference validates a training run on rectangular batches whatever `rect` says; `val` follows `rect`,
  // whose default is on in that mode (resolve_settings).
  if (role == LoaderRole::kTrainingValidation) config.rect = true;
  return config;
}

std::shared_ptr<const data::DatasetIndex> load_split(const data::DatasetSpec& spec, const std::string& split,
                                                     const Settings& settings, bool verbose) {
  data::CheckOptions options;
  options.nc = spec.nc;
  options.workers = std::max(1, settings.loader.workers);
  options.cancelled = [] { return stop_requested(); };
  bool cancelled = false;  // a stop, not a data error: kept out of as_input_error
  auto index = std::make_shared<data::DatasetIndex>(as_input_error([&] {
    try {
      return data::build_split_index(spec, split, options);
    } catch (const data::CheckCancelled&) {
      cancelled = true;
      return data::DatasetIndex{};
    }
  }));
  if (cancelled) throw StoppedBeforeTraining("checking the " + split + " split of " + spec.yaml_path);
  if (verbose) data::print_report(std::cout, split, *index, 10);
  if (index->records.empty()) {
    throw DataError(spec.yaml_path + ": split '" + split + "' has no usable image (see the report above)");
  }
  return index;
}

torch::Tensor model_input(const torch::Tensor& images, const torch::Device& device, bool channels_last) {
  const torch::Tensor on_device = images.to(device);
  torch::Tensor input = torch::empty(
      on_device.sizes(),
      on_device.options()
          .dtype(torch::kFloat)
          .memory_format(channels_last ? torch::MemoryFormat::ChannelsLast : torch::MemoryFormat::Contiguous));
  // The conversion into the final layout, then the same in-place division as before: the same values. One
  // division over a strided uint8 source (div_out) is slower than copy_'s conversion plus div_.
  input.copy_(on_device);
  return input.div_(255.0);
}

std::string ValidationTimes::per_image() const {
  const double per = 1000.0 / static_cast<double>(std::max<int64_t>(1, images));
  std::ostringstream out;
  out << std::fixed << std::setprecision(1) << waiting * per << " ms waiting for data, " << preprocess * per
      << " ms preprocess, " << inference * per << " ms inference, " << postprocess * per << " ms postprocess per image";
  return out.str();
}

// Runs a model (eval mode) over a loader; `loss` adds the validation loss when given; `plot_dir` (when not
// empty) receives the first batch's labels and predictions as mosaics. The loader's workers decode and letterbox
// the next batches while this thread runs the model (`waiting` is what they did not hide).
ValidationTimes run_validation(DetectionModel& model, data::DataLoader& loader, DetectionValidator& validator,
                               const DetectionLoss* loss, const torch::Device& device, bool channels_last, bool half,
                               const std::string& prefix, const fs::path& plot_dir,
                               const std::vector<std::string>& names) {
  torch::NoGradGuard no_grad;
  const bool was_training = model->is_training();
  model->eval();
  loader.start_epoch(0);
  ProgressBar bar(prefix, loader.num_batches());
  ValidationTimes times;
  long done = 0;
  // A CUDA kernel runs after its launch returns: the stages are timed up to a synchronised point (the NMS copies
  // the predictions to the host), so on a GPU `inference` is the launch and `postprocess` includes the wait.
  auto mark = Clock::now();
  const auto lap = [&mark](double& stage) {
    const auto now = Clock::now();
    stage += std::chrono::duration<double>(now - mark).count();
    mark = now;
  };
  for (;;) {
    std::optional<data::Batch> batch = loader.next();
    lap(times.waiting);
    if (!batch) break;
    const torch::Tensor images = model_input(batch->images, device, channels_last);
    lap(times.preprocess);
    DetectOutput output;
    {
      AutocastGuard autocast(device.type(), half && autocast_applies(true, device.type()));
      output = model->forward(images);
    }
    output.pred = output.pred.to(torch::kFloat);
    for (auto& level : output.feats) level = level.to(torch::kFloat);
    lap(times.inference);
    const std::vector<torch::Tensor> detections = validator.add_batch(
        output.pred, batch->labels, images.size(2), images.size(3), batch_geometry(*batch), batch->paths);
    if (loss != nullptr) validator.add_loss(*loss, output.feats, batch->labels);
    lap(times.postprocess);
    times.images += static_cast<int64_t>(batch->paths.size());
    if (!plot_dir.empty() && batch->index == 0) {
      try_plot("validation mosaics", [&] {
        plot_batch_mosaic((plot_dir / "val_batch0_labels.jpg").string(), batch->images, batch->labels, names,
                          batch->paths);
        plot_batch_mosaic((plot_dir / "val_batch0_pred.jpg").string(), batch->images,
                          detections_to_mosaic_rows(detections, batch->ratio_pad, images.size(2), images.size(3)),
                          names, batch->paths);
      });
    }
    bar.update(++done, "");
    mark = Clock::now();          // plots and the bar are no stage of the model's
    if (stop_is_urgent()) break;  // a second signal: the checkpoint matters, the numbers do not
  }
  bar.finish("");
  model->train(was_training);
  return times;
}

void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path);
  if (!out) throw std::runtime_error("cannot write " + path.string());
  out << text;
}

}  // namespace yolo8::app
