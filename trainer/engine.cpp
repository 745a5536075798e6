// Dataset-driven modes. Compiled only with OpenCV; see engine.h.
#ifdef YOLO8_HAVE_DATA

#include "trainer/engine.h"

#include <nlohmann/json.hpp>
#ifdef YOLO8_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <yaml-cpp/yaml.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <thread>

#include "data/augment.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "data/synth.h"
#include "trainer/checkpoint.h"
#include "trainer/distributed.h"
#include "trainer/exit_codes.h"
#include "trainer/lease.h"
#include "trainer/memory_meter.h"
#include "trainer/plots.h"
#include "trainer/profiler.h"
#include "trainer/progress.h"
#include "trainer/run_dir.h"
#include "trainer/stop_signal.h"
#include "trainer/train_step.h"
#include "trainer/validator.h"

namespace yolo8 {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

std::string yaml_text(const YAML::Node& node) {
  YAML::Emitter emitter;
  emitter << node;
  return emitter.c_str();
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

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

void configure_threads(const Settings& settings) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  torch::set_num_threads(settings.threads > 0 ? settings.threads : cores);
  at::globalContext().setDeterministicAlgorithms(settings.deterministic, /*warn_only=*/true);
}

torch::Device pick_device(const Settings& settings) {
  const std::vector<int> ids = settings.device_ids();
#ifdef YOLO8_WITH_CUDA
  if (ids.size() > 1) {
    // One process per GPU (launched by yolo8 itself, torchrun or an indexed Job): LOCAL_RANK picks the GPU.
    const char* local_rank = std::getenv("LOCAL_RANK");
    const size_t index = local_rank ? static_cast<size_t>(std::atoi(local_rank)) : 0;
    if (index >= ids.size()) throw SettingsError("LOCAL_RANK " + std::to_string(index) + " has no GPU in device=" + settings.device);
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

data::LoaderConfig loader_config(const Settings& settings, int batch, int stride, bool train) {
  data::LoaderConfig config;
  config.imgsz = settings.imgsz;
  config.batch = batch;
  config.workers = settings.workers;
  config.cache = data::parse_cache_mode(settings.cache);
  config.rect = train ? settings.rect : true;
  config.single_cls = settings.single_cls;
  config.fraction = train ? settings.fraction : 1.0;
  config.seed = static_cast<uint64_t>(settings.seed);
  config.stride = stride;
  config.shuffle = train;
  return config;
}

data::AugmentConfig augment_config(const Settings& settings) {
  data::AugmentConfig config;
  config.hsv_h = settings.hsv_h;
  config.hsv_s = settings.hsv_s;
  config.hsv_v = settings.hsv_v;
  config.degrees = settings.degrees;
  config.translate = settings.translate;
  config.scale = settings.scale;
  config.shear = settings.shear;
  config.perspective = settings.perspective;
  config.flipud = settings.flipud;
  config.fliplr = settings.fliplr;
  config.mosaic = settings.mosaic;
  config.mixup = settings.mixup;
  config.close_mosaic = settings.close_mosaic;
  return config;
}

std::shared_ptr<const data::DatasetIndex> load_split(const data::DatasetSpec& spec, const std::string& split,
                                                     const Settings& settings, bool verbose) {
  data::CheckOptions options;
  options.nc = spec.nc;
  options.workers = std::max(1, settings.workers);
  auto index = std::make_shared<data::DatasetIndex>(
      as_input_error([&] { return data::build_split_index(spec, split, options); }));
  if (verbose) data::print_report(std::cout, split, *index, 10);
  if (index->records.empty()) {
    throw DataError(spec.yaml_path + ": split '" + split + "' has no usable image (see the report above)");
  }
  return index;
}

std::vector<ImageGeometry> batch_geometry(const data::Batch& batch) {
  std::vector<ImageGeometry> geometry;
  const torch::Tensor ratio_pad = batch.ratio_pad.to(torch::kDouble).contiguous();
  const auto rows = ratio_pad.accessor<double, 2>();
  for (size_t i = 0; i < batch.orig_shapes.size(); ++i) {
    geometry.push_back({batch.orig_shapes[i].first, batch.orig_shapes[i].second, rows[i][0], rows[i][1], rows[i][2],
                        rows[i][3]});
  }
  return geometry;
}

// Runs a model (eval mode) over a loader; `loss` adds the validation loss when given.
// Plots must never stop a run: a failure is a warning.
template <typename Function>
void try_plot(const std::string& what, Function&& function) {
  try {
    function();
  } catch (const std::exception& error) {
    std::cerr << "warning: could not plot " << what << ": " << error.what() << "\n";
  }
}

// Runs a model (eval mode) over a loader; `loss` adds the validation loss when given; `plot_dir` (when not
// empty) receives the first batch's labels and predictions as mosaics.
void run_validation(DetectionModel& model, data::DataLoader& loader, DetectionValidator& validator,
                    const DetectionLoss* loss, const torch::Device& device, bool channels_last,
                    const std::string& prefix, const fs::path& plot_dir = {},
                    const std::vector<std::string>& names = {}) {
  torch::NoGradGuard no_grad;
  const bool was_training = model->is_training();
  model->eval();
  loader.start_epoch(0);
  ProgressBar bar(prefix, loader.num_batches());
  long done = 0;
  while (auto batch = loader.next()) {
    torch::Tensor images = batch->images.to(device).to(torch::kFloat).div_(255.0);
    if (channels_last) images = images.contiguous(torch::MemoryFormat::ChannelsLast);
    const DetectOutput output = model->forward(images);
    const std::vector<torch::Tensor> detections = validator.add_batch(
        output.pred, batch->labels, images.size(2), images.size(3), batch_geometry(*batch), batch->paths);
    if (!plot_dir.empty() && batch->index == 0) {
      try_plot("validation mosaics", [&] {
        plot_batch_mosaic((plot_dir / "val_batch0_labels.jpg").string(), batch->images, batch->labels, names,
                          batch->paths);
        plot_batch_mosaic((plot_dir / "val_batch0_pred.jpg").string(), batch->images,
                          detections_to_mosaic_rows(detections, batch->ratio_pad, images.size(2), images.size(3)),
                          names, batch->paths);
      });
    }
    if (loss != nullptr) validator.add_loss(*loss, output.feats, batch->labels);
    bar.update(++done, "");
    if (stop_is_urgent()) break;  // a second signal: the checkpoint matters, the numbers do not
  }
  bar.finish("");
  model->train(was_training);
}

struct CheckpointMeta {
  std::string settings_yaml;
  std::string model_yaml;
  std::vector<std::string> names;
  std::string run_dir;
};

std::string encode_meta(const CheckpointMeta& meta) {
  nlohmann::json json;
  json["settings"] = meta.settings_yaml;
  json["model_yaml"] = meta.model_yaml;
  json["names"] = meta.names;
  json["run_dir"] = meta.run_dir;
  return json.dump();
}

CheckpointMeta decode_meta(const std::string& text, const std::string& path) {
  try {
    const nlohmann::json json = nlohmann::json::parse(text);
    return {json.at("settings").get<std::string>(), json.at("model_yaml").get<std::string>(),
            json.at("names").get<std::vector<std::string>>(), json.value("run_dir", std::string())};
  } catch (const std::exception& error) {
    throw DataError(path + ": not a yolo8 training checkpoint (" + error.what() + ")");
  }
}

DetectionModel model_from_meta(const CheckpointMeta& meta, const std::string& source, int64_t nc_override = 0) {
  return build_model(YAML::Load(meta.model_yaml), source, "", nc_override);
}

// Copies every tensor whose name and shape match; returns how many.
size_t transfer_matching(torch::nn::Module& module, const std::map<std::string, torch::Tensor>& source) {
  torch::NoGradGuard no_grad;
  size_t copied = 0;
  for (auto& [name, tensor] : state_dict(module)) {
    const auto found = source.find(name);
    if (found == source.end() || !found->second.sizes().equals(tensor.sizes())) continue;
    tensor.copy_(found->second.to(tensor.dtype()));
    ++copied;
  }
  return copied;
}

std::map<std::string, torch::Tensor> as_map(const NamedTensors& tensors) {
  return std::map<std::string, torch::Tensor>(tensors.begin(), tensors.end());
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path);
  if (!out) throw std::runtime_error("cannot write " + path.string());
  out << text;
}



}  // namespace

bool is_training_checkpoint(const std::string& path) {
  if (fs::path(path).extension() != ".pt" || !fs::is_regular_file(path)) return false;
  return checkpoint_readable(path);
}

LoadedModel load_any_model(const std::string& spec, int64_t nc_override) {
  if (!is_training_checkpoint(spec)) return as_input_error([&] { return load_model(spec, nc_override); });
  const CheckpointState state = load_checkpoint(spec);
  const CheckpointMeta meta = decode_meta(state.settings_text, spec);
  DetectionModel model = model_from_meta(meta, spec);
  DetectionModel ema_model = model_from_meta(meta, spec);
  ModelEma ema(ema_model.ptr(), *model);
  CheckpointTargets targets;
  targets.model = model.ptr().get();
  targets.ema = &ema;
  targets.load_grads = false;
  load_checkpoint(spec, targets);
  LoadedModel loaded;
  loaded.model = ema_model;  // the EMA weights are the ones a run validates and ships
  loaded.model->eval();
  loaded.nc = ema_model->nc();
  loaded.names = meta.names;
  loaded.source = spec;
  if (nc_override > 0 && nc_override != loaded.nc) {
    throw DataError(spec + ": weights have " + std::to_string(loaded.nc) + " classes, the data " +
                    std::to_string(nc_override));
  }
  return loaded;
}

std::string resolve_resume_checkpoint(const Settings& settings) {
  const std::string& resume = settings.resume;
  if (resume == "false") return "";
  if (resume == "auto") {
    const fs::path candidate = fs::path(settings.project) / "train" /
                               (settings.name.empty() ? std::string("train") : settings.name) / "weights" / "last.pt";
    std::string error;
    if (fs::exists(candidate) && checkpoint_readable(candidate.string(), &error)) return candidate.string();
    if (fs::exists(candidate)) std::cout << "resume=auto: " << candidate.string() << " is not resumable (" << error
                                         << "); starting fresh\n";
    return "";
  }
  const std::string path = resume == "true" ? latest_last_checkpoint(settings.project, "train").string() : resume;
  if (path.empty()) throw SettingsError("resume=true but no " + settings.project + "/train/*/weights/last.pt exists");
  std::string error;
  if (!checkpoint_readable(path, &error)) throw DataError("cannot resume from " + path + ": " + error);
  return path;
}

int run_train(const Settings& requested) {
  const auto run_start = Clock::now();
  install_stop_signal_handlers();
  configure_threads(requested);
  Settings settings = requested;

  // Resuming restores the run's own settings; only where and how fast it runs may change.
  const std::string resume_path = resolve_resume_checkpoint(requested);
  CheckpointMeta resume_meta;
  fs::path run_dir;
  if (!resume_path.empty()) {
    const CheckpointState peek = load_checkpoint(resume_path);
    resume_meta = decode_meta(peek.settings_text, resume_path);
    const std::string saved_cfg = (fs::temp_directory_path() / ("yolo8-resume-" + std::to_string(getpid()) + ".yaml"));
    write_text(saved_cfg, resume_meta.settings_yaml);
    Settings restored = resolve_settings({{"cfg", saved_cfg}}, "train");
    fs::remove(saved_cfg);
    for (const char* key : {"batch", "device", "workers", "quota", "quota_db", "quota_token", "gpu_mem", "threads",
                            "verbose", "plots"}) {
      if (get_setting(requested, key) != get_setting(Settings{}, key)) {
        set_setting(restored, key, get_setting(requested, key));
      }
    }
    restored.resume = requested.resume;
    settings = restored;
    run_dir = fs::path(resume_path).parent_path().parent_path();
    std::cout << "Resuming " << resume_path << " (epoch " << peek.epoch + 1 << ", batch " << peek.iteration_in_epoch
              << ")\n";
  }
  if (settings.data.empty()) throw SettingsError("setting 'data' is required for train, e.g. data=coco128.yaml");
  torch::manual_seed(static_cast<uint64_t>(settings.seed));
  const torch::Device device = pick_device(settings);
  // Data parallel when RANK/WORLD_SIZE say so; rank 0 validates, saves, plots and holds the lease.
  DistributedContext dist = DistributedContext::from_env(device);
  const bool is_main = dist.is_main();
  if (!is_main) std::cout.setstate(std::ios::failbit);
  double lease_gib = 0.0;  // memory per GPU granted by the quota service (0: none)

  // Data.
  data::DatasetSpec spec = as_input_error([&] { return data::load_data_yaml(settings.data); });
  std::vector<std::string> names = spec.names;
  if (settings.single_cls) names = {"item"};
  const int64_t nc = static_cast<int64_t>(names.size());
  const auto train_index = load_split(spec, "train", settings, settings.verbose);
  const auto val_index = load_split(spec, spec.val.empty() ? "train" : "val", settings, settings.verbose);

  // Model: a YAML starts fresh (optionally from pretrained weights); a .pt continues from its weights.
  DetectionModel model{nullptr};
  DetectionModel ema_model{nullptr};
  if (!resume_path.empty()) {
    model = model_from_meta(resume_meta, resume_path);
    ema_model = model_from_meta(resume_meta, resume_path);
  } else {
    const bool from_weights = fs::path(settings.model).extension() == ".pt";
    if (from_weights) {
      LoadedModel loaded = load_any_model(settings.model);
      model = build_model(loaded.model->config().yaml, settings.model, "", nc);
      const size_t copied = transfer_matching(*model, as_map(state_dict(*loaded.model)));
      std::cout << "Transferred " << copied << "/" << state_dict(*model).size() << " tensors from " << settings.model
                << "\n";
    } else {
      model = as_input_error([&] { return build_model(settings.model, nc); });
      if (settings.pretrained != "true" && settings.pretrained != "false") {
        LoadedModel loaded = load_any_model(settings.pretrained);
        const size_t copied = transfer_matching(*model, as_map(state_dict(*loaded.model)));
        std::cout << "Transferred " << copied << "/" << state_dict(*model).size() << " tensors from "
                  << settings.pretrained << "\n";
      }
    }
    ema_model = DetectionModel(model->config());
  }
  const int stride = static_cast<int>(model->max_stride());
  if (settings.imgsz % stride != 0) {
    const int rounded = (settings.imgsz + stride - 1) / stride * stride;
    std::cout << "imgsz=" << settings.imgsz << " is not a multiple of the stride " << stride << "; using " << rounded
              << "\n";
    settings.imgsz = rounded;
  }

  // The lease comes before the batch: its memory is the budget the batch is sized to.
  const std::string job_name = run_dir.empty() ? (settings.name.empty() ? std::string("train") : settings.name)
                                               : run_dir.filename().string();
  std::unique_ptr<TrainingLease> lease;
  try {
    Settings lease_settings = settings;
    if (!is_main) lease_settings.quota = "off";
    lease = std::make_unique<TrainingLease>(lease_settings, job_name, device.is_cuda(),
                                            std::max<int>(1, static_cast<int>(settings.device_ids().size())));
  } catch (const StoppedWhileWaiting& stopped) {
    std::cout << stopped.what() << "\n";
    return kExitPreempted;
  } catch (const quota::QuotaRefused& refused) {
    std::string message = "the quota service refused the lease (" + std::to_string(refused.status()) + "): " +
                          refused.what();
    if (refused.max_batch() > 0) message += "; at most batch=" + std::to_string(refused.max_batch()) + " fits";
    throw DataError(message);
  }
  lease_gib = lease->memory_gib();
  // An explicit budget is enforced: on CUDA as the allocator's fraction, on CPU by the counting allocator.
  if (lease_gib > 0 || settings.gpu_mem > 0) {
    cap_memory_bytes(static_cast<int64_t>(memory_budget_bytes(settings, device, lease_gib)), device);
  }
  int batch = settings.batch >= 1 ? static_cast<int>(settings.batch) : 0;
  if (batch == 0) {
    const double budget = memory_budget_bytes(settings, device, lease_gib);
    std::cout << "batch=" << get_setting(settings, "batch") << ": sizing the batch to a budget of " << std::fixed
              << std::setprecision(2) << budget / kBytesPerGib << " GiB\n";
    const AutoBatchResult chosen =
        auto_batch_for(model->config(), settings, device, budget, static_cast<int>(train_index->records.size()));
    std::cout << format_auto_batch_summary(chosen) << "\n";
    batch = chosen.batch;
  }
  // `batch` is global; under data parallelism each process loads its share.
  int local_batch = batch;
  if (dist.enabled()) {
    const int world = dist.world_size();
    if (settings.batch >= 1) {
      if (batch % world != 0) {
        throw SettingsError("setting 'batch' (" + std::to_string(batch) + ", global) must be a multiple of the " +
                            std::to_string(world) + " processes");
      }
      local_batch = batch / world;
    } else {
      local_batch = static_cast<int>(-dist.all_reduce_max(-static_cast<int64_t>(batch)));  // the smallest fit
      batch = local_batch * world;
    }
  }
  if (run_dir.empty()) {
    run_dir = is_main ? make_run_dir(settings.project, "train", settings.name, settings.exist_ok)
                      : fs::temp_directory_path() / ("yolo8-rank" + std::to_string(dist.rank()));
  }
  if (is_main) write_text(run_dir / "args.yaml", settings_to_yaml(settings));
  std::cout << "Settings:\n" << settings_table(settings) << "Run folder: " << run_dir.string() << "\n";

  data::LoaderConfig train_config = loader_config(settings, local_batch, stride, true);
  train_config.rank = dist.rank();
  train_config.world_size = dist.world_size();
  data::DataLoader train_loader(train_index, train_config, augment_config(settings), true);
  data::DataLoader val_loader(val_index, loader_config(settings, local_batch * 2, stride, false),
                              augment_config(settings), false);
  const int64_t batches_per_epoch = train_loader.num_batches();

  TrainCoreConfig core_config;
  core_config.optim.optimizer = settings.optimizer;
  core_config.optim.lr0 = settings.lr0;
  core_config.optim.lrf = settings.lrf;
  core_config.optim.momentum = settings.momentum;
  core_config.optim.weight_decay = settings.weight_decay;
  core_config.optim.warmup_epochs = settings.warmup_epochs;
  core_config.optim.warmup_momentum = settings.warmup_momentum;
  core_config.optim.warmup_bias_lr = settings.warmup_bias_lr;
  core_config.optim.nbs = settings.nbs;
  core_config.optim.cos_lr = settings.cos_lr;
  core_config.shape = RunShape{train_loader.size(), batch, settings.epochs, nc};
  core_config.batches_per_epoch = batches_per_epoch;
  core_config.box = settings.box;
  core_config.cls = settings.cls;
  core_config.dfl = settings.dfl;
  core_config.channels_last = settings.channels_last;
  core_config.freeze_layers = freeze_layer_indices(settings.freeze);
  core_config.device = device;
  core_config.amp = settings.amp && device.is_cuda();
  if (dist.enabled()) {
    dist.broadcast_parameters(*model);
    // The loss is a sum over the local batch, so summed gradients equal one process on the global batch.
    core_config.before_optimizer_step = [&dist](const std::vector<torch::Tensor>& parameters) {
      dist.average_gradients(parameters, GradReduction::kSum);
    };
  }
  TrainingCore core(model, ema_model, core_config);

  CheckpointMeta meta{settings_to_yaml(settings), yaml_text(model->config().yaml), names, run_dir.string()};
  int64_t start_epoch = 0;
  int64_t first_batch = 0;
  double best_fitness = 0.0;
  bool has_best = false;
  if (!resume_path.empty()) {
    CheckpointTargets targets;
    targets.model = core.model().ptr().get();
    targets.ema = &core.ema();
    targets.optimizer = &core.optimizer();
    targets.device = device;
    const CheckpointState state = load_checkpoint(resume_path, targets);
    if (settings.channels_last) {
      to_channels_last(*core.model());  // loading may hand back contiguous tensors; the layout changes the maths
      to_channels_last(*core.ema_model());
    }
    core.schedule().restore(state.schedule);
    // A run resumed without amp (or on CPU) keeps its default identity scaler.
    if (state.has_grad_scaler && core.grad_scaler().enabled()) core.grad_scaler().restore(state.grad_scaler);
    restore_torch_rng(state.rng);
    start_epoch = state.epoch;
    first_batch = state.iteration_in_epoch;
    best_fitness = state.best_fitness;
    has_best = state.has_best_fitness;
    if (state.batch != batch) {
      // Nominal batch kept: accumulation and decay follow the new batch; the epoch restarts at its beginning.
      first_batch = 0;
      const BatchPlan plan = core.schedule().change_batch(core.optimizer(), batch, batches_per_epoch,
                                                          start_epoch * batches_per_epoch);
      std::cout << "Batch changed " << state.batch << " -> " << batch << ": accumulate " << plan.accumulate
                << ", epoch " << start_epoch + 1 << " restarts\n";
    }
    if (start_epoch >= settings.epochs) {
      std::cout << resume_path << " already finished its " << settings.epochs << " epochs\n";
      lease->release(quota::Outcome::kCompleted);
      return kExitCompleted;
    }
  }
  if (settings.plots && is_main && resume_path.empty()) {
    try_plot("labels", [&] { plot_labels((run_dir / "labels.jpg").string(), dataset_labels(*train_index), names); });
  }
  std::unique_ptr<ResultsCsv> results;
  if (is_main) {
    results = std::make_unique<ResultsCsv>(run_dir / "results.csv");
    results->keep_epochs_up_to(static_cast<int>(start_epoch));
  }

  auto save = [&](const fs::path& path, int64_t epoch, int64_t iteration_in_epoch, int64_t global_iteration,
                  bool with_optimizer, bool with_grads) {
    if (!is_main) return;
    CheckpointState state;
    state.epoch = epoch;
    state.iteration_in_epoch = iteration_in_epoch;
    state.global_iteration = global_iteration;
    state.batch = batch;
    state.schedule = core.schedule().state();
    state.best_fitness = best_fitness;
    state.has_best_fitness = has_best;
    state.settings_text = encode_meta(meta);
    state.rng = capture_torch_rng();
    state.has_grad_scaler = core.grad_scaler().enabled();
    state.grad_scaler = core.grad_scaler().state();
    CheckpointSources sources;
    sources.model = core.model().ptr().get();
    sources.ema = &core.ema();
    sources.optimizer = with_optimizer ? &core.optimizer() : nullptr;
    sources.include_grads = with_grads;
    save_checkpoint(path.string(), state, sources);
    lease->telemetry().last_checkpoint_ms.store(std::chrono::duration_cast<std::chrono::milliseconds>(
                                                    std::chrono::system_clock::now().time_since_epoch())
                                                    .count());
  };

  const fs::path last_pt = run_dir / "weights" / "last.pt";
  const fs::path best_pt = run_dir / "weights" / "best.pt";
  std::cout << "Training " << settings.model << " on " << train_loader.size() << " images, " << val_loader.size()
            << " for validation, batch " << batch << " (accumulate " << core.schedule().accumulate() << " to nbs "
            << settings.nbs << "), " << settings.epochs << " epochs, " << torch::get_num_threads() << " threads, "
            << (device.is_cuda() ? "CUDA" : "CPU") << "\n";

  // Test hook: behave as if SIGTERM arrived during global iteration N (0-based count of finished steps).
  const char* stop_env = std::getenv("YOLO8_TEST_STOP_AT_ITERATION");
  const int64_t stop_at_iteration = stop_env ? std::atoll(stop_env) : -1;
  int64_t chunks = 1;  // passes per batch; grows only when a step runs out of memory
  StopReason pending_stop = StopReason::kNone;
  int epochs_without_improvement = 0;
  const double time_limit_s = settings.time * 3600.0;
  double images_seen = 0;
  double train_seconds = 0;
  double busy_seconds = 0;  // inside training steps
  const auto train_start = Clock::now();
  MemoryMeter run_meter(device);  // peak tensor memory of the run (CUDA allocator stats, or the CPU counter)
  // What the run cost, printed and stored as cost.json at every exit of the loop.
  auto report_cost = [&](const std::string& outcome) {
    const double wall = seconds_since(run_start);
    const int gpus = device.is_cuda() ? std::max(1, dist.world_size()) : 0;
    nlohmann::json cost;
    cost["outcome"] = outcome;
    cost["wall_seconds"] = wall;
    cost["gpu_hours"] = wall / 3600.0 * gpus;
    const double training_wall = seconds_since(train_start);  // epochs including validation
    cost["images_per_second"] = training_wall > 0 ? images_seen / training_wall : 0.0;
    cost["busy_fraction"] = training_wall > 0 ? busy_seconds / training_wall : 0.0;
    cost["peak_memory_gib"] = static_cast<double>(run_meter.peak_bytes()) / kBytesPerGib;
    cost["lease_memory_gib"] = lease_gib;
    cost["lease_id"] = lease->id();
    cost["batch"] = batch;
    cost["device"] = device.str();
    if (is_main) write_text(run_dir / "cost.json", cost.dump(2) + "\n");
    std::printf("Cost: %.2f GPU-hours, %.1f images/s, busy %.0f%% of the time, peak memory %.2f GiB%s\n",
                cost["gpu_hours"].get<double>(), cost["images_per_second"].get<double>(),
                100.0 * cost["busy_fraction"].get<double>(), cost["peak_memory_gib"].get<double>(),
                lease_gib > 0 ? (" of a " + std::to_string(lease_gib).substr(0, 5) + " GiB lease").c_str() : "");
  };
  for (int64_t epoch = start_epoch; epoch < settings.epochs; ++epoch) {
    const auto epoch_start = Clock::now();
    if (train_loader.update_close_mosaic(epoch, settings.epochs) == false && epoch == settings.epochs - settings.close_mosaic) {
      std::cout << "Closing the mosaic for the last " << settings.close_mosaic << " epochs\n";
    }
    const int64_t epoch_first_batch = epoch == start_epoch ? first_batch : 0;
    train_loader.start_epoch(epoch, epoch_first_batch);
    // The reference drops gradients left over from the previous epoch's unfinished accumulation.
    if (epoch_first_batch == 0) core.optimizer().zero_grad();
    core.model()->train();
    torch::Tensor loss_sum = torch::zeros({3}, torch::kDouble);
    int64_t loss_count = 0;
    char prefix[64];
    std::snprintf(prefix, sizeof(prefix), "%lld/%d", static_cast<long long>(epoch + 1), settings.epochs);
    ProgressBar bar(prefix, batches_per_epoch);
    int64_t done = epoch == start_epoch ? first_batch : 0;
    int64_t instances = 0;
    double wait_s = 0.0, step_s = 0.0;
    auto wait_start = Clock::now();
    while (auto batch_data = train_loader.next()) {
      wait_s += seconds_since(wait_start);
      if (settings.plots && is_main && epoch == 0 && batch_data->index < 3) {
        try_plot("training batch", [&] {
          plot_batch_mosaic((run_dir / ("train_batch" + std::to_string(batch_data->index) + ".jpg")).string(),
                            batch_data->images, batch_data->labels, names, batch_data->paths);
        });
      }
      const auto step_start = Clock::now();
      const int64_t i = batch_data->index;
      const int64_t ni = i + batches_per_epoch * epoch;
      // The first epoch guards against running out of memory: the batch is split in two and retried.
      StepOutcome outcome;
      if (epoch == start_epoch) {
        std::vector<torch::Tensor> saved_grads;
        for (auto& parameter : core.model()->parameters()) {
          saved_grads.push_back(parameter.grad().defined() ? parameter.grad().clone() : torch::Tensor());
        }
        while (true) {
          try {
            outcome = core.step(epoch, ni, batch_data->images, batch_data->labels, chunks);
            break;
          } catch (const std::exception& error) {
            const int64_t chunk_size = (batch_data->images.size(0) + chunks - 1) / chunks;
            if (!is_out_of_memory(error) || chunk_size <= 1) throw;
            size_t k = 0;
            for (auto& parameter : core.model()->parameters()) {
              const torch::Tensor& saved = saved_grads[k++];
              if (saved.defined()) {
                parameter.mutable_grad() = saved.clone();
              } else {
                parameter.mutable_grad() = torch::Tensor();
              }
            }
            release_cached_memory(device);
            chunks *= 2;
            std::cout << "\nOut of memory at " << chunk_size << " images per pass; retrying in passes of "
                      << (batch_data->images.size(0) + chunks - 1) / chunks << " (the batch stays " << batch
                      << ")\n";
          }
        }
      } else {
        outcome = core.step(epoch, ni, batch_data->images, batch_data->labels, chunks);
      }
      loss_sum += outcome.loss_items.to(torch::kCPU).to(torch::kDouble);
      ++loss_count;
      step_s += seconds_since(step_start);
      busy_seconds += seconds_since(step_start);
      instances = batch_data->labels.size(0);
      images_seen += static_cast<double>(batch_data->images.size(0));
      ++done;
      const torch::Tensor mean = loss_sum / static_cast<double>(loss_count);
      char fields[160];
      std::snprintf(fields, sizeof(fields), "box %.4f cls %.4f dfl %.4f inst %3lld size %lld",
                    mean[0].item<double>(), mean[1].item<double>(), mean[2].item<double>(),
                    static_cast<long long>(instances), static_cast<long long>(batch_data->images.size(2)));
      bar.update(done, fields);
      if (time_limit_s > 0 && seconds_since(run_start) > time_limit_s) request_stop(StopReason::kTimeLimit);
      if (stop_at_iteration >= 0 && ni + 1 >= stop_at_iteration) request_stop(StopReason::kSignal);
      lease->telemetry().step.store(ni + 1);
      lease->telemetry().epoch.store(static_cast<int>(epoch));
      lease->telemetry().memory_used_gib.store(static_cast<double>(run_meter.peak_bytes()) / kBytesPerGib);
      lease->telemetry().gpu_util.store(busy_seconds / std::max(1e-9, seconds_since(train_start)));
      lease->check();
      // Every rank agrees on the stop at the same step (a no-op for one process).
      pending_stop = agree_on_stop(dist);
      // A stop inside the epoch checkpoints here; on its last batch the epoch-end path below saves instead.
      if (pending_stop != StopReason::kNone && i + 1 < batches_per_epoch) {
        bar.finish(fields);
        const auto stop_start = Clock::now();
        save(last_pt, epoch, i + 1, ni + 1, true, true);
        dist.barrier();
        std::cout << "Stopped (" << to_string(pending_stop) << ") in epoch " << epoch + 1 << " after batch " << i + 1
                  << "; checkpoint " << last_pt.string() << " written in " << std::fixed << std::setprecision(2)
                  << seconds_since(stop_start) << " s, " << seconds_since_stop_request()
                  << " s after the stop request. Resume with resume=" << last_pt.string() << "\n";
        const bool timed_out = pending_stop == StopReason::kTimeLimit;
        lease->release(timed_out ? quota::Outcome::kCompleted : quota::Outcome::kPreempted);
        report_cost(timed_out ? "completed" : "preempted");
        return timed_out ? kExitCompleted : kExitPreempted;
      }
      if (pending_stop != StopReason::kNone) break;
      wait_start = Clock::now();
    }
    bar.finish("");
    if (settings.verbose) {
      std::printf("      time: steps %.1f s, waiting for data %.1f s (%.0f%%)\n", step_s, wait_s,
                  100.0 * wait_s / std::max(1e-9, wait_s + step_s));
    }
    train_seconds += seconds_since(epoch_start);
    const std::vector<double> lrs = core.learning_rates();
    core.end_epoch();

    const bool final_epoch = epoch + 1 == settings.epochs;
    DetectionResults metrics;
    std::vector<double> val_loss = {0, 0, 0};
    // A pending stop skips validation: the grace period is for the checkpoint.
    if ((settings.val || final_epoch) && pending_stop == StopReason::kNone && is_main) {
      ValConfig val_config;
      val_config.single_cls = settings.single_cls;
      DetectionValidator validator(nc, names, val_config);
      run_validation(core.ema_model(), val_loader, validator, &core.loss(), device, settings.channels_last,
                     "      val");
      metrics = validator.results();
      val_loss = validator.mean_loss();
      std::cout << validator.table();
    }
    const torch::Tensor mean_loss = loss_count ? loss_sum / static_cast<double>(loss_count) : loss_sum;
    const double fitness = metrics.fitness;
    const bool improved = !has_best || fitness >= best_fitness;
    if (improved) {
      best_fitness = fitness;
      has_best = true;
      epochs_without_improvement = 0;
    } else {
      ++epochs_without_improvement;
    }
    const double elapsed = seconds_since(run_start);
    if (is_main) results->append({static_cast<double>(epoch + 1), mean_loss[0].item<double>(), mean_loss[1].item<double>(),
                    mean_loss[2].item<double>(), metrics.precision, metrics.recall, metrics.map50, metrics.map50_95,
                    val_loss[0], val_loss[1], val_loss[2], lrs.at(0), lrs.at(1), lrs.at(2), elapsed,
                    static_cast<double>(run_meter.peak_bytes()) / kBytesPerGib,
                    device.is_cuda() ? elapsed / 3600.0 * std::max(1, dist.world_size()) : 0.0,
                    train_seconds > 0 ? images_seen / train_seconds : 0.0});
    if (settings.plots && is_main) {
      try_plot("results", [&] {
        plot_results_csv((run_dir / "results.csv").string(), (run_dir / "results.png").string());
      });
    }
    if (settings.save) {
      save(last_pt, epoch + 1, 0, (epoch + 1) * batches_per_epoch, true, false);
      if (improved) save(best_pt, epoch + 1, 0, (epoch + 1) * batches_per_epoch, false, false);
      if (settings.save_period > 0 && (epoch + 1) % settings.save_period == 0) {
        save(run_dir / "weights" / ("epoch" + std::to_string(epoch + 1) + ".pt"), epoch + 1, 0,
             (epoch + 1) * batches_per_epoch, false, false);
      }
    }
    if (pending_stop == StopReason::kNone) pending_stop = agree_on_stop(dist);
    if (pending_stop != StopReason::kNone) {
      dist.barrier();
      std::cout << "Stopped (" << to_string(pending_stop) << ") at the end of epoch " << epoch + 1 << "; checkpoint "
                << last_pt.string() << " written " << std::fixed << std::setprecision(2)
                << seconds_since_stop_request() << " s after the stop request\n";
      const bool timed_out = pending_stop == StopReason::kTimeLimit;
      lease->release(timed_out ? quota::Outcome::kCompleted : quota::Outcome::kPreempted);
      report_cost(timed_out ? "completed" : "preempted");
      return timed_out ? kExitCompleted : kExitPreempted;
    }
    const bool patience_hit = is_main && settings.patience > 0 && epochs_without_improvement >= settings.patience;
    const bool time_hit = time_limit_s > 0 && elapsed > time_limit_s;
    if (dist.all_reduce_flag(patience_hit || time_hit)) {
      std::cout << (patience_hit ? "Stopping early: no improvement in the last " + std::to_string(settings.patience) +
                                       " epochs\n"
                                 : "Time limit of " + std::to_string(settings.time) + " h reached\n");
      break;
    }
  }

  if (!is_main) {
    report_cost("completed");
    return kExitCompleted;
  }
  // Final validation of best.pt with the per-class table.
  if (settings.save && fs::exists(best_pt)) {
    std::cout << "\nValidating " << best_pt.string() << "\n";
    LoadedModel best = load_any_model(best_pt.string());
    best.model->to(device);
    if (settings.channels_last) to_channels_last(*best.model);
    ValConfig val_config;
    val_config.single_cls = settings.single_cls;
    val_config.save_json = settings.save_json;
    DetectionValidator validator(nc, names, val_config);
    run_validation(best.model, val_loader, validator, nullptr, device, settings.channels_last, "      val",
                   settings.plots ? run_dir : fs::path(), names);
    std::cout << validator.table();
    if (settings.save_json) validator.write_json((run_dir / "predictions.json").string());
    if (settings.plots) {
      try_plot("validation curves", [&] {
        plot_validation(run_dir.string(), validator.results().per_class, validator.confusion().matrix(), names);
      });
    }
  }
  lease->release(quota::Outcome::kCompleted);
  report_cost("completed");
  const double total_s = seconds_since(run_start);
  std::cout << "\n" << settings.epochs - start_epoch << " epochs completed in " << std::fixed << std::setprecision(3)
            << total_s / 3600.0 << " hours (" << std::setprecision(1) << (train_seconds > 0 ? images_seen / train_seconds : 0)
            << " training images/s). Results saved to " << run_dir.string() << "\n";
  return kExitCompleted;
}

int run_val(const Settings& settings) {
  configure_threads(settings);
  if (settings.data.empty()) throw SettingsError("setting 'data' is required for val");
  const torch::Device device = pick_device(settings);
  data::DatasetSpec spec = as_input_error([&] { return data::load_data_yaml(settings.data); });
  std::vector<std::string> names = settings.single_cls ? std::vector<std::string>{"item"} : spec.names;
  LoadedModel loaded = load_any_model(settings.model, static_cast<int64_t>(names.size()));
  if (!loaded.names.empty() && !settings.single_cls) names = loaded.names;
  DetectionModel model = loaded.model;
  model->to(device);
  model->eval();
  if (settings.channels_last) to_channels_last(*model);
  const auto index = load_split(spec, settings.split, settings, settings.verbose);
  const int stride = static_cast<int>(model->max_stride());
  const int batch = settings.batch >= 1 ? static_cast<int>(settings.batch) : 32;
  data::DataLoader loader(index, loader_config(settings, batch, stride, false), augment_config(settings), false);
  ValConfig config;
  config.conf = settings.conf >= 0 ? settings.conf : 0.001;
  config.iou = settings.iou;
  config.max_det = settings.max_det;
  config.single_cls = settings.single_cls;
  config.save_json = settings.save_json;
  DetectionValidator validator(model->nc(), names, config);
  const auto start = Clock::now();
  run_validation(model, loader, validator, nullptr, device, settings.channels_last, "val");
  const double seconds = seconds_since(start);
  std::cout << validator.table();
  std::cout << "Speed: " << std::fixed << std::setprecision(1) << 1000.0 * seconds / std::max<int64_t>(1, loader.size())
            << " ms per image at imgsz " << settings.imgsz << " (loading, inference, NMS)\n";
  if (settings.save_json) {
    const fs::path run_dir = make_run_dir(settings.project, "val", settings.name, settings.exist_ok);
    validator.write_json((run_dir / "predictions.json").string());
    std::cout << "Predictions written to " << (run_dir / "predictions.json").string() << "\n";
  }
  return kExitCompleted;
}

namespace {

cv::Scalar class_colour(int64_t cls) {
  static const int kPalette[][3] = {{56, 56, 255}, {151, 157, 255}, {31, 112, 255}, {29, 178, 255},
                                    {49, 210, 207}, {10, 249, 72},   {23, 204, 146}, {134, 219, 61},
                                    {52, 147, 26},  {187, 212, 0},   {168, 153, 44}, {255, 194, 0}};
  const auto& c = kPalette[cls % 12];
  return cv::Scalar(c[0], c[1], c[2]);
}

std::vector<std::string> list_images(const std::string& source) {
  std::vector<std::string> files;
  if (fs::is_directory(source)) {
    for (const auto& entry : fs::recursive_directory_iterator(source)) {
      if (entry.is_regular_file() && data::is_image_extension(entry.path().string())) {
        files.push_back(entry.path().string());
      }
    }
    std::sort(files.begin(), files.end());
  } else if (fs::is_regular_file(source)) {
    files.push_back(source);
  } else {
    throw DataError("source '" + source + "' is neither an image nor a folder");
  }
  return files;
}

}  // namespace

int run_predict(const Settings& settings) {
  configure_threads(settings);
  if (settings.source.empty()) throw SettingsError("setting 'source' is required for predict (an image or a folder)");
  const torch::Device device = pick_device(settings);
  LoadedModel loaded = load_any_model(settings.model);
  DetectionModel model = loaded.model;
  model->to(device);
  model->eval();
  torch::NoGradGuard no_grad;
  const int stride = static_cast<int>(model->max_stride());
  const fs::path run_dir = make_run_dir(settings.project, "predict", settings.name, settings.exist_ok);
  if (settings.save_txt) fs::create_directories(run_dir / "labels");
  NmsConfig nms;
  nms.conf_thres = settings.conf >= 0 ? settings.conf : 0.25;
  nms.iou_thres = settings.iou;
  nms.max_det = settings.max_det;
  nms.agnostic = settings.agnostic_nms;
  const std::vector<std::string> files = list_images(settings.source);
  int64_t total_detections = 0;
  for (const std::string& file : files) {
    const cv::Mat image = cv::imread(file, cv::IMREAD_COLOR);
    if (image.empty()) {
      std::cerr << "predict: skipping unreadable image " << file << "\n";
      continue;
    }
    // Minimal padding to the stride, as the reference's predictor does.
    const double gain = std::min(static_cast<double>(settings.imgsz) / image.rows,
                                 static_cast<double>(settings.imgsz) / image.cols);
    const int new_h = static_cast<int>(std::lround(image.rows * gain));
    const int new_w = static_cast<int>(std::lround(image.cols * gain));
    const int out_h = (new_h + stride - 1) / stride * stride;
    const int out_w = (new_w + stride - 1) / stride * stride;
    data::LetterboxInfo info;
    const cv::Mat boxed = data::letterbox(image, out_h, out_w, true, &info);
    cv::Mat rgb;
    cv::cvtColor(boxed, rgb, cv::COLOR_BGR2RGB);
    torch::Tensor input = torch::from_blob(rgb.data, {1, rgb.rows, rgb.cols, 3}, torch::kUInt8)
                              .permute({0, 3, 1, 2})
                              .to(device)
                              .to(torch::kFloat)
                              .div_(255.0)
                              .contiguous();
    torch::Tensor detections = non_max_suppression(model->predict(input).to(torch::kCPU), nms)[0];
    if (!settings.classes.empty() && detections.size(0) > 0) {
      torch::Tensor keep = torch::zeros({detections.size(0)}, torch::kBool);
      for (int cls : settings.classes) keep |= detections.select(1, 5) == cls;
      detections = detections.index({keep});
    }
    const ImageGeometry geometry{image.rows, image.cols, info.ratio, info.ratio, static_cast<double>(info.left),
                                 static_cast<double>(info.top)};
    detections = boxes_to_original(detections, geometry);
    total_detections += detections.size(0);
    cv::Mat drawn = image.clone();
    const int thickness = settings.line_width > 0 ? settings.line_width
                                                  : std::max(1, static_cast<int>(std::lround((image.rows + image.cols) * 0.002)));
    std::ofstream txt;
    if (settings.save_txt) txt.open(run_dir / "labels" / (fs::path(file).stem().string() + ".txt"));
    const auto rows = detections.accessor<float, 2>();
    for (int64_t k = 0; k < detections.size(0); ++k) {
      const int64_t cls = static_cast<int64_t>(rows[k][5]);
      const cv::Point top_left(static_cast<int>(rows[k][0]), static_cast<int>(rows[k][1]));
      const cv::Point bottom_right(static_cast<int>(rows[k][2]), static_cast<int>(rows[k][3]));
      cv::rectangle(drawn, top_left, bottom_right, class_colour(cls), thickness, cv::LINE_AA);
      if (settings.show_labels) {
        std::ostringstream label;
        label << (cls < static_cast<int64_t>(loaded.names.size()) ? loaded.names[cls] : std::to_string(cls));
        if (settings.show_conf) label << " " << std::fixed << std::setprecision(2) << rows[k][4];
        int baseline = 0;
        const double font = std::max(0.4, thickness / 3.0);
        const cv::Size size = cv::getTextSize(label.str(), cv::FONT_HERSHEY_SIMPLEX, font, 1, &baseline);
        const cv::Point origin(top_left.x, std::max(size.height + 2, top_left.y));
        cv::rectangle(drawn, origin - cv::Point(0, size.height + 2), origin + cv::Point(size.width, baseline),
                      class_colour(cls), cv::FILLED);
        cv::putText(drawn, label.str(), origin, cv::FONT_HERSHEY_SIMPLEX, font, cv::Scalar(255, 255, 255), 1,
                    cv::LINE_AA);
      }
      if (txt) {
        const double cx = (rows[k][0] + rows[k][2]) / 2.0 / image.cols, cy = (rows[k][1] + rows[k][3]) / 2.0 / image.rows;
        const double w = (rows[k][2] - rows[k][0]) / image.cols, h = (rows[k][3] - rows[k][1]) / image.rows;
        txt << cls << " " << std::setprecision(6) << cx << " " << cy << " " << w << " " << h;
        if (settings.save_conf) txt << " " << rows[k][4];
        txt << "\n";
      }
    }
    if (settings.save) cv::imwrite((run_dir / fs::path(file).filename()).string(), drawn);
    std::cout << file << ": " << detections.size(0) << " detections\n";
  }
  std::cout << files.size() << " images, " << total_detections << " detections. Results saved to " << run_dir.string()
            << "\n";
  return kExitCompleted;
}

int run_data_check(const Settings& settings) {
  if (settings.data.empty()) throw SettingsError("setting 'data' is required: yolo8 data check data=d.yaml");
  const bool usable = data::check_dataset(settings.data, std::cout, std::max(1, settings.workers));
  return usable ? kExitCompleted : kExitBadInput;
}

int run_data_synth(const std::string& out, int train_images, int val_images, int imgsz, int seed) {
  if (out.empty()) throw SettingsError("setting 'out' is required: yolo8 data synth out=DIR train=N val=M");
  const data::SynthResult result =
      data::synthesize_dataset(out, train_images, val_images, imgsz, static_cast<uint64_t>(seed));
  std::cout << "Wrote " << result.train_images << " training images (" << result.train_instances << " objects) and "
            << result.val_images << " validation images (" << result.val_instances << " objects): "
            << result.yaml_path << "\n";
  return kExitCompleted;
}

}  // namespace yolo8

#endif  // YOLO8_HAVE_DATA
