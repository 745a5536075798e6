// `yolo8 train`, split into set-up, epochs, epoch end and finish. Built only with OpenCV (trainer/run/CMakeLists.txt).

#include "trainer/run/train_run.h"

#include <nlohmann/json.hpp>
#ifdef YOLO8_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iomanip>
#include <iostream>

#include "common/exit_codes.h"
#include "trainer/batch/batch_size.h"
#include "trainer/cli/ultralytics_args.h"
#include "trainer/core/autocast.h"
#include "trainer/core/checkpoint.h"
#include "trainer/plots/plots.h"
#include "trainer/runtime/threads.h"

namespace yolo8 {
namespace fs = std::filesystem;
using app::Clock;
using app::seconds_since;

TrainingRun::TrainingRun(const Settings& requested, TrainingRunOptions options)
    : options_(options), requested_(requested), settings_(requested) {}

TrainingRun::~TrainingRun() = default;

int run_train(const Settings& settings) { return TrainingRun(settings).run(); }

int TrainingRun::run() {
  if (const std::optional<int> exit_code = set_up()) return *exit_code;
  for (int64_t epoch = start_epoch_; epoch < settings_.epochs; ++epoch) {
    EpochTotals totals;
    if (const std::optional<int> exit_code = train_epoch(epoch, totals)) return *exit_code;
    const EpochEnd end = end_epoch(epoch, totals);
    if (end.exit_code) return *end.exit_code;
    if (end.stop_training) break;
  }
  return finish();
}

// ---------------------------------------------------------------------------------------------------- set-up

std::optional<int> TrainingRun::set_up_phases() {
  run_start_ = Clock::now();
  // Rank 0 prints; known before the process group forms, so every line of the set-up follows it.
  console_ = std::make_unique<Console>(distributed_config_from_env().rank);
  install_stop_signal_handlers();
  const ThreadChoice threads = configure_threads(requested_);
  console_->out() << threads.explain() << ", at most " << loader_workers(requested_.loader.workers, threads.share)
                  << " loader workers\n";
  settings_ = requested_;
  resume_path_ = resolve_resume_checkpoint(requested_);
  if (!resume_path_.empty()) adopt_resumed_settings();
  if (settings_.data.empty()) throw SettingsError("setting 'data' is required for train, e.g. data=coco128.yaml");
  torch::manual_seed(settings_.loader.seed);
  device_ = app::pick_device(settings_);
  // Data parallel when RANK/WORLD_SIZE say so; rank 0 validates, saves, plots and holds the lease.
  dist_ = DistributedContext::from_env(device_);
  is_main_ = dist_.is_main();
  encode_in_background_ = encode_checkpoints_in_background(device_.is_cuda(), threads.threads, threads.share);

  load_datasets();
  throw_if_stop_requested("checking the dataset");
  build_models();
  throw_if_stop_requested("building the model");
  acquire_lease();
  throw_if_stop_requested("acquiring the lease");
  size_batch();
  throw_if_stop_requested("sizing the batch");
  lease_->telemetry().batch.store(local_batch_);
  open_run_dir();
  create_loaders();
  build_training_core();
  if (const std::optional<int> exit_code = restore_checkpoint()) return exit_code;
  throw_if_stop_requested("restoring the checkpoint");
  prepare_outputs();
  return std::nullopt;
}

// Resuming restores the run's own settings; only the resumable keys (where and how fast it runs) may change.
void TrainingRun::adopt_resumed_settings() {
  const CheckpointState peek = load_checkpoint(resume_path_);
  resume_meta_ = app::decode_meta(peek.settings_text, resume_path_);
  resumed_optimizer_ = peek.optimizer_choice;
  Settings saved;
  apply_yaml_text(saved, resume_meta_.settings_yaml, resume_path_ + " (saved settings)");
  saved.mode = "train";
  settings_ = merge_resumed_settings(saved, requested_);
  validate(settings_);
  run_dir_ = fs::path(resume_path_).parent_path().parent_path();
  console_->out() << "Resuming " << resume_path_ << " (epoch " << peek.epoch + 1 << ", batch "
                  << peek.iteration_in_epoch << ")\n";
}

void TrainingRun::load_datasets() {
  spec_ = app::as_input_error([&] { return data::load_data_yaml(settings_.data); });
  names_ = spec_.names;
  if (settings_.loader.single_cls) names_ = {"item"};
  nc_ = static_cast<int64_t>(names_.size());
  train_index_ = app::load_split(spec_, "train", settings_, settings_.verbose && is_main_);
  val_index_ = app::load_split(spec_, spec_.val.empty() ? "train" : "val", settings_, settings_.verbose && is_main_);
}

// A YAML starts fresh (optionally from pretrained weights); a .pt continues from its weights.
void TrainingRun::build_models() {
  if (!resume_path_.empty()) {
    model_ = app::model_from_meta(resume_meta_, resume_path_);
    ema_model_ = app::model_from_meta(resume_meta_, resume_path_);
  } else {
    const bool from_weights = fs::path(settings_.model).extension() == ".pt";
    if (from_weights) {
      LoadedModel loaded = load_any_model(settings_.model);
      model_ = build_model(loaded.model->config().yaml, settings_.model, "", nc_);
      const size_t copied = app::transfer_matching(*model_, app::as_map(state_dict(*loaded.model)));
      console_->out() << "Transferred " << copied << "/" << state_dict(*model_).size() << " tensors from "
                      << settings_.model << "\n";
    } else {
      model_ = app::as_input_error([&] { return build_model(settings_.model, nc_); });
      if (settings_.pretrained != "true" && settings_.pretrained != "false") {
        LoadedModel loaded = load_any_model(settings_.pretrained);
        const size_t copied = app::transfer_matching(*model_, app::as_map(state_dict(*loaded.model)));
        console_->out() << "Transferred " << copied << "/" << state_dict(*model_).size() << " tensors from "
                        << settings_.pretrained << "\n";
      }
    }
    ema_model_ = DetectionModel(model_->config());
  }
  stride_ = static_cast<int>(model_->max_stride());
  int& imgsz = settings_.loader.imgsz;
  if (imgsz % stride_ != 0) {
    const int rounded = (imgsz + stride_ - 1) / stride_ * stride_;
    console_->out() << "imgsz=" << imgsz << " is not a multiple of the stride " << stride_ << "; using " << rounded
                    << "\n";
    imgsz = rounded;
  }
}

// The lease comes before the batch: its memory is the budget the batch is sized to.
void TrainingRun::acquire_lease() {
  const std::string job_name = run_dir_.empty() ? (settings_.name.empty() ? std::string("train") : settings_.name)
                                                : run_dir_.filename().string();
  try {
    Settings lease_settings = settings_;
    if (!is_main_) lease_settings.lease.quota = "off";
    // Rank 0 asks for the whole job: WORLD_SIZE GPUs, whether the ranks share this machine (device=0,1) or
    // are the pods of an indexed Job (device=0 in each).
    const int gpus =
        dist_.enabled() ? dist_.world_size() : std::max<int>(1, static_cast<int>(settings_.device_ids().size()));
    // The local quota's inventory is this machine's GPUs (local:i is CUDA ordinal i): a whole-GPU lease then
    // carries their memory. Reading a GPU's properties creates no context on it.
    LocalGpus local_gpus;
    if (device_.is_cuda()) {
      local_gpus.count = static_cast<int>(torch::cuda::device_count());
      for (int i = 0; i < local_gpus.count; ++i) {
        const double gib =
            static_cast<double>(default_memory_budget_bytes(torch::Device(torch::kCUDA, i))) / kBytesPerGib;
        local_gpus.memory_gib = i == 0 ? gib : std::min(local_gpus.memory_gib, gib);
      }
    }
    // The folder this run will write to, when known already (a resume; a fresh start that reuses its folder, as
    // a restarted pod does): an earlier run's unacknowledged lease there is released first.
    fs::path unreleased_file;
    if (!run_dir_.empty()) {
      unreleased_file = run_dir_ / kUnreleasedLeaseFile;
    } else if (is_main_ && (settings_.exist_ok || settings_.resume == "auto")) {
      unreleased_file = project_dir(settings_.project, settings_.task) /
                        (settings_.name.empty() ? std::string("train") : settings_.name) / kUnreleasedLeaseFile;
    }
    auto lease = std::make_unique<TrainingLease>(lease_settings, job_name, device_.is_cuda(), gpus, local_gpus,
                                                 device_name(device_), unreleased_file);
    std::lock_guard<std::mutex> lock(set_up_mutex_);  // the set-up watchdog may release it
    lease_ = std::move(lease);
  } catch (const quota::QuotaRefused& refused) {
    std::string message =
        "the quota service refused the lease (" + std::to_string(refused.status()) + "): " + refused.what();
    if (refused.max_batch() > 0) message += "; at most batch=" + std::to_string(refused.max_batch()) + " fits";
    throw DataError(message);
  }
  // device= empty picked GPU 0 before the grant: a single process moves to the leased GPU before anything is
  // placed on a device (the batch sizing, the memory cap, the model). DDP ranks keep LOCAL_RANK's GPU of
  // device=, which the lease checked.
  const std::vector<int>& leased = lease_->devices().ordinals;
  if (device_.is_cuda() && !dist_.enabled() && !leased.empty()) {
    device_ = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(leased.front()));
#ifdef YOLO8_WITH_CUDA
    c10::cuda::set_device(device_.index());
#endif
    console_->out() << lease_->devices().summary << "\n";
  }
  lease_gib_ = lease_->memory_gib();
  // An explicit budget is enforced: on CUDA as the allocator's fraction, on CPU by the counting allocator.
  if (lease_gib_ > 0 || settings_.lease.gpu_mem > 0) {
    cap_memory_bytes(static_cast<int64_t>(memory_budget_bytes(settings_, device_, lease_gib_)), device_);
  }
}

void TrainingRun::size_batch() {
  batch_ = settings_.batch >= 1 ? static_cast<int>(settings_.batch) : 0;
  if (batch_ == 0) {
    const double budget = memory_budget_bytes(settings_, device_, lease_gib_);
    console_->out() << "batch=" << get_setting(settings_, "batch") << ": sizing the batch to a budget of " << std::fixed
                    << std::setprecision(2) << budget / kBytesPerGib << " GiB\n";
    const AutoBatchResult chosen =
        auto_batch_for(model_->config(), settings_, device_, budget, static_cast<int>(train_index_->records.size()));
    console_->out() << format_auto_batch_summary(chosen) << "\n";
    batch_ = chosen.batch;
  }
  // `batch` is global; under data parallelism each process loads its share.
  local_batch_ = batch_;
  if (dist_.enabled()) {
    const int world = dist_.world_size();
    if (settings_.batch >= 1) {
      if (batch_ % world != 0) {
        throw SettingsError("setting 'batch' (" + std::to_string(batch_) + ", global) must be a multiple of the " +
                            std::to_string(world) + " processes");
      }
      local_batch_ = batch_ / world;
    } else {
      local_batch_ = static_cast<int>(-dist_.all_reduce_max(-static_cast<int64_t>(batch_)));  // the smallest fit
      batch_ = local_batch_ * world;
    }
  }
}

void TrainingRun::open_run_dir() {
  if (run_dir_.empty()) {
    // resume=auto names the folder it continues (a restarted Job pod must land there even when its predecessor
    // died before the first checkpoint), so a fresh start takes that folder rather than NAME2.
    const bool reuse_folder = settings_.exist_ok || settings_.resume == "auto";
    run_dir_ = is_main_
                   ? make_run_dir(project_dir(settings_.project, settings_.task), "train", settings_.name, reuse_folder)
                   : fs::temp_directory_path() / ("yolo8-rank" + std::to_string(dist_.rank()));
  }
  if (is_main_ && lease_) lease_->remember_unreleased_in(run_dir_ / kUnreleasedLeaseFile);
  if (is_main_) {
    // args.yaml for Ultralytics (its get_cfg refuses keys it does not know), yolo8_args.yaml with every setting.
    app::write_text(run_dir_ / "args.yaml", ultralytics_args_yaml(ultralytics_args(settings_, run_dir_.string())));
    app::write_text(run_dir_ / "yolo8_args.yaml", settings_to_yaml(settings_));
  }
  console_->out() << "Settings:\n" << settings_table(settings_) << "Run folder: " << run_dir_.string() << "\n";
}

void TrainingRun::create_loaders() {
  data::LoaderConfig train_config =
      app::loader_config(settings_, local_batch_, stride_, app::LoaderRole::kTrain, device_);
  train_config.rank = dist_.rank();
  train_config.world_size = dist_.world_size();
  train_loader_ = std::make_unique<data::DataLoader>(train_index_, train_config, settings_.augment, true);
  val_loader_ = std::make_unique<data::DataLoader>(
      val_index_,
      app::loader_config(settings_, local_batch_ * 2, stride_, app::LoaderRole::kTrainingValidation, device_),
      settings_.augment, false);
  batches_per_epoch_ = train_loader_->num_batches();
}

void TrainingRun::build_training_core() {
  TrainCoreConfig config;
  config.optim = settings_.optim;
  config.shape = RunShape{train_loader_->size(), batch_, settings_.epochs, nc_};
  config.batches_per_epoch = batches_per_epoch_;
  config.gains = settings_.loss;
  config.channels_last = settings_.channels_last;
  config.freeze_layers = freeze_layer_indices(settings_.freeze);
  config.device = device_;
  config.amp = settings_.amp;  // the core decides where it applies (autocast_applies)
  config.cuda_amp_dtype = cuda_autocast_dtype(settings_.amp_dtype);
  if (settings_.amp && device_.is_cuda() && config.cuda_amp_dtype == c10::ScalarType::BFloat16 &&
      !cuda_device_has_bfloat16(device_.has_index() ? device_.index() : 0)) {
    throw std::invalid_argument(
        "amp_dtype=bfloat16 needs a GPU of compute capability 8.0 or newer (A100, L4, H100, "
        "...); this one computes bfloat16 slowly or not at all: use amp_dtype=float16");
  }
  // `auto` was resolved when the run began; a resume (even with another batch) trains with that choice. Files
  // written before the choice was stored hold an empty name and resolve again.
  if (!resumed_optimizer_.name.empty()) config.optimizer_choice = resumed_optimizer_;
  if (dist_.enabled()) {
    dist_.broadcast_parameters(*model_);
    // The loss is a sum over the local batch, so summed gradients equal one process on the global batch; they are
    // reduced bucket by bucket while the window's last backward runs.
    config.gradient_sync = std::make_shared<OverlappedGradReducer>(dist_, GradReduction::kSum);
  }
  core_ = std::make_unique<TrainingCore>(model_, ema_model_, config);
  oom_guard_ = std::make_unique<OomGuard>(device_, [this](int64_t from, int64_t to, const std::string&) {
    console_->out() << "\nOut of memory at " << from << " images per pass; retrying in passes of " << to
                    << " (the batch stays " << batch_ << ")\n";
  });
  meta_ = app::CheckpointMeta{settings_to_yaml(settings_), app::yaml_text(model_->config().yaml), names_,
                              run_dir_.string(), ultralytics_args_yaml(ultralytics_args(settings_, run_dir_.string()))};
}

// Weights, optimizer, EMA, counters, scaler and RNG of the checkpoint; an exit code when it already finished.
std::optional<int> TrainingRun::restore_checkpoint() {
  if (resume_path_.empty()) return std::nullopt;
  TrainingCore& core = *core_;
  CheckpointTargets targets;
  targets.model = core.model().ptr().get();
  targets.ema = &core.ema();
  targets.optimizer = &core.optimizer();
  targets.device = device_;
  const CheckpointState state = load_checkpoint(resume_path_, targets);
  if (settings_.channels_last) {
    to_channels_last(*core.model());  // loading may hand back contiguous tensors; the layout changes the maths
    to_channels_last(*core.ema_model());
  }
  core.schedule().restore(state.schedule);
  // A run resumed without amp (or on CPU) keeps its default identity scaler.
  if (state.has_grad_scaler && core.grad_scaler().enabled()) core.grad_scaler().restore(state.grad_scaler);
  restore_torch_rng(state.rng);
  start_epoch_ = state.epoch;
  first_batch_ = state.iteration_in_epoch;
  best_fitness_ = state.best_fitness;
  has_best_ = state.has_best_fitness;
  if (state.batch != batch_) {
    // Nominal batch kept: accumulation and decay follow the new batch; the epoch restarts at its beginning.
    first_batch_ = 0;
    const BatchPlan plan =
        core.schedule().change_batch(core.optimizer(), batch_, batches_per_epoch_, start_epoch_ * batches_per_epoch_);
    console_->out() << "Batch changed " << state.batch << " -> " << batch_ << ": accumulate " << plan.accumulate
                    << ", epoch " << start_epoch_ + 1 << " restarts\n";
  }
  if (start_epoch_ >= settings_.epochs) {
    console_->out() << resume_path_ << " already finished its " << settings_.epochs << " epochs\n";
    lease_->release(quota::Outcome::kCompleted);
    return kExitCompleted;
  }
  return std::nullopt;
}

void TrainingRun::prepare_outputs() {
  if (settings_.plots && is_main_ && resume_path_.empty()) {
    app::try_plot("labels",
                  [&] { plot_labels((run_dir_ / "labels.jpg").string(), dataset_labels(*train_index_), names_); });
    app::try_plot("labels_correlogram", [&] {
      plot_labels_correlogram((run_dir_ / "labels_correlogram.jpg").string(), dataset_labels(*train_index_));
    });
  }
  if (is_main_) {
    results_ = std::make_unique<ResultsCsv>(run_dir_ / "results.csv");
    results_->keep_epochs_up_to(static_cast<int>(start_epoch_));
  }
  last_pt_ = run_dir_ / "weights" / "last.pt";
  best_pt_ = run_dir_ / "weights" / "best.pt";
  console_->out() << "Training " << settings_.model << " on " << train_loader_->size() << " images, "
                  << val_loader_->size() << " for validation, batch " << batch_ << " (accumulate "
                  << core_->schedule().accumulate() << " to nbs " << settings_.optim.nbs << "), " << settings_.epochs
                  << " epochs, " << torch::get_num_threads() << " threads, " << (device_.is_cuda() ? "CUDA" : "CPU")
                  << (core_->autocast()
                          ? (device_.is_cuda() ? " with AMP (" + settings_.amp_dtype + ")" : " with AMP (bfloat16)")
                          : std::string())
                  << "\n";
  time_limit_s_ = settings_.time * 3600.0;
  train_start_ = Clock::now();
  run_meter_ = std::make_unique<MemoryMeter>(device_);
  if (dist_.enabled() && device_.is_cuda()) {
    std::string why;
    rank_nvml_ = Nvml::load(kNvmlLibrary, &why);
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    const std::vector<std::string> names =
        nvml_device_names({device_.has_index() ? device_.index() : 0}, visible ? visible : "", cuda_device_uuid);
    if (!names.empty()) rank_nvml_device_ = names.front();
    if (!rank_nvml_) {
      std::cerr << "yolo8: rank " << dist_.rank() << ": NVML unavailable (" << why
                << "); the job reports the busy share of the time\n";
    }
  }
}

// ---------------------------------------------------------------------------------------------------- epochs

std::optional<int> TrainingRun::train_epoch(int64_t epoch, EpochTotals& totals) {
  const auto epoch_start = Clock::now();
  data::DataLoader& loader = *train_loader_;
  if (loader.update_close_mosaic(epoch, settings_.epochs) == false &&
      epoch == settings_.epochs - settings_.augment.close_mosaic) {
    console_->out() << "Closing the mosaic for the last " << settings_.augment.close_mosaic << " epochs\n";
  }
  const int64_t epoch_first_batch = epoch == start_epoch_ ? first_batch_ : 0;
  loader.start_epoch(epoch, epoch_first_batch);
  // The reference drops gradients left over from the previous epoch's unfinished accumulation.
  if (epoch_first_batch == 0) core_->optimizer().zero_grad();
  core_->model()->train();
  char prefix[64];
  std::snprintf(prefix, sizeof(prefix), "%lld/%d", static_cast<long long>(epoch) + 1, settings_.epochs);
  ProgressBar bar(prefix, batches_per_epoch_, *console_);
  int64_t done = epoch_first_batch;
  double wait_s = 0.0, step_s = 0.0;
  // A stop usually waits for the batch under way; one that has not come within the grace may never come. A
  // data-parallel rank waits longer (within Kubernetes' 30 s): leaving alone, it costs the others their checkpoint.
  const double stalled_stop_grace = dist_.enabled() ? 20.0 : 2.0;
  const auto next_batch = [&]() -> std::optional<data::Batch> {
    try {
      return loader.next(
          [stalled_stop_grace] { return stop_requested() && seconds_since_stop_request() >= stalled_stop_grace; });
    } catch (const data::WaitAbandoned&) {
      bar.finish("");
      exit_while_stalled(epoch, done - 1);
    }
  };
  auto wait_start = Clock::now();
  while (auto batch = next_batch()) {
    wait_s += seconds_since(wait_start);
    if (settings_.plots && is_main_ && epoch == 0 && batch->index < 3) {
      app::try_plot("training batch", [&] {
        plot_batch_mosaic((run_dir_ / ("train_batch" + std::to_string(batch->index) + ".jpg")).string(), batch->images,
                          batch->labels, names_, batch->paths);
      });
    }
    const auto step_start = Clock::now();
    const int64_t i = batch->index;
    const int64_t ni = i + batches_per_epoch_ * epoch;
    // The first epoch guards against running out of memory: the batch is split in two and retried.
    const StepOutcome outcome = epoch == start_epoch_
                                    ? core_->guarded_step(epoch, ni, batch->images, batch->labels, *oom_guard_)
                                    : core_->step(epoch, ni, batch->images, batch->labels, oom_guard_->passes());
    totals.loss_sum += outcome.loss_items.to(torch::kCPU).to(torch::kDouble);
    ++totals.loss_count;
    step_s += seconds_since(step_start);
    busy_seconds_ += seconds_since(step_start);
    images_seen_ += static_cast<double>(batch->images.size(0));
    ++done;
    const torch::Tensor mean = totals.loss_sum / static_cast<double>(totals.loss_count);
    char fields[160];
    std::snprintf(fields, sizeof(fields), "box %.4f cls %.4f dfl %.4f inst %3lld size %lld", mean[0].item<double>(),
                  mean[1].item<double>(), mean[2].item<double>(), static_cast<long long>(batch->labels.size(0)),
                  static_cast<long long>(batch->images.size(2)));
    bar.update(done, fields);
    record_step_and_agree_on_stop(epoch, ni);
    // A stop inside the epoch checkpoints here; on its last batch the epoch-end path saves instead.
    if (pending_stop_ != StopReason::kNone && i + 1 < batches_per_epoch_) {
      bar.finish(fields);
      return stop_inside_epoch(epoch, i, ni);
    }
    if (pending_stop_ != StopReason::kNone) break;
    wait_start = Clock::now();
  }
  bar.finish("");
  if (settings_.verbose) {
    console_->printf("      time: steps %.1f s, waiting for data %.1f s (%.0f%%)\n", step_s, wait_s,
                     100.0 * wait_s / std::max(1e-9, wait_s + step_s));
  }
  train_seconds_ += seconds_since(epoch_start);
  totals.learning_rates = core_->learning_rates();
  core_->end_epoch();
  return std::nullopt;
}

// Time limit, the options' stop, lease telemetry and heartbeat; then every rank agrees on a stop at the same step.
void TrainingRun::record_step_and_agree_on_stop(int64_t epoch, int64_t ni) {
  if (time_limit_s_ > 0 && seconds_since(run_start_) > time_limit_s_) request_stop(StopReason::kTimeLimit);
  if (options_.stop_at_iteration >= 0 && ni + 1 >= options_.stop_at_iteration) request_stop(StopReason::kSignal);
  LeaseTelemetry& telemetry = lease_->telemetry();
  telemetry.step.store(ni + 1);
  telemetry.epoch.store(static_cast<int>(epoch));
  // One lease covers every rank and rank 0's heartbeat speaks for them: the mean busy time, the largest peak and
  // each rank's own device (NVML) over the ranks, combined every few steps (each combination is a round trip
  // between the ranks). A stall combines nothing: rank 0's heartbeat then stops trusting the ranks' figures after
  // one interval (with_other_ranks).
  constexpr int64_t kTelemetrySyncSteps = 10;
  if (!dist_.enabled() || ni % kTelemetrySyncSteps == 0) {
    const double busy =
        dist_.all_reduce_mean(torch::tensor({busy_seconds_}, torch::kDouble)).to(torch::kCPU).item<double>();
    const int64_t peak = dist_.all_reduce_max(static_cast<int64_t>(run_meter_->peak_bytes()));
    telemetry.memory_used_gib.store(static_cast<double>(peak) / kBytesPerGib);
    telemetry.busy_seconds.store(busy);
    if (dist_.enabled() && device_.is_cuda()) {  // on CPU the busy time above is the figure
      const std::optional<Nvml::DeviceSample> device =
          rank_nvml_ && !rank_nvml_device_.empty() ? rank_nvml_->sample(rank_nvml_device_) : std::nullopt;
      // summed: the ranks' utilisation and the ranks without a reading; the busiest device's memory in MiB
      const torch::Tensor sums =
          dist_.all_reduce_sum(torch::tensor({device ? device->util : 0.0, device ? 0.0 : 1.0}, torch::kDouble))
              .to(torch::kCPU);
      const int64_t busiest_mib = dist_.all_reduce_max(device ? std::llround(device->memory_used_gib * 1024) : 0);
      telemetry.set_ranks(RanksUtilisation::from_sums(dist_.world_size(), sums[0].item<double>(),
                                                      sums[1].item<double>(), busiest_mib / 1024.0,
                                                      monotonic_seconds()));
    }
  }
  lease_->check();
  pending_stop_ = agree_on_stop(dist_);  // a no-op for one process
}

// ---------------------------------------------------------------------------------------------------- epoch end

TrainingRun::EpochEnd TrainingRun::end_epoch(int64_t epoch, const EpochTotals& totals) {
  const bool final_epoch = epoch + 1 == settings_.epochs;
  DetectionResults metrics;
  std::vector<double> val_loss = {0, 0, 0};
  validate_epoch(final_epoch, metrics, val_loss);
  const torch::Tensor mean_loss =
      totals.loss_count ? totals.loss_sum / static_cast<double>(totals.loss_count) : totals.loss_sum;
  const double fitness = metrics.fitness;
  const bool improved = !has_best_ || fitness >= best_fitness_;
  if (improved) {
    best_fitness_ = fitness;
    has_best_ = true;
    epochs_without_improvement_ = 0;
  } else {
    ++epochs_without_improvement_;
  }
  const double elapsed = seconds_since(run_start_);
  const std::vector<double>& lrs = totals.learning_rates;
  if (is_main_) {
    ResultsRow row;
    row.epoch = static_cast<int>(epoch + 1);
    row.train_box_loss = mean_loss[0].item<double>();
    row.train_cls_loss = mean_loss[1].item<double>();
    row.train_dfl_loss = mean_loss[2].item<double>();
    row.precision = metrics.precision;
    row.recall = metrics.recall;
    row.map50 = metrics.map50;
    row.map50_95 = metrics.map50_95;
    row.val_box_loss = val_loss[0];
    row.val_cls_loss = val_loss[1];
    row.val_dfl_loss = val_loss[2];
    row.lr_pg0 = lrs.at(0);
    row.lr_pg1 = lrs.at(1);
    row.lr_pg2 = lrs.at(2);
    row.time = elapsed;
    row.gpu_mem_gib = static_cast<double>(run_meter_->peak_bytes()) / kBytesPerGib;
    row.gpu_hours = device_.is_cuda() ? elapsed / 3600.0 * std::max(1, dist_.world_size()) : 0.0;
    row.images_per_s = train_seconds_ > 0 ? images_seen_ / train_seconds_ : 0.0;
    results_->append(row);
  }
  if (settings_.plots && is_main_) {
    app::try_plot("results",
                  [&] { plot_results_csv((run_dir_ / "results.csv").string(), (run_dir_ / "results.png").string()); });
  }
  if (settings_.save) save_epoch_checkpoints(epoch, improved);
  if (pending_stop_ == StopReason::kNone) pending_stop_ = agree_on_stop(dist_);
  if (pending_stop_ != StopReason::kNone) return EpochEnd{stop_at_epoch_end(epoch), false};
  const bool patience_hit = is_main_ && settings_.patience > 0 && epochs_without_improvement_ >= settings_.patience;
  const bool time_hit = time_limit_s_ > 0 && elapsed > time_limit_s_;
  if (dist_.all_reduce_flag(patience_hit || time_hit)) {
    console_->out() << (patience_hit ? "Stopping early: no improvement in the last " +
                                           std::to_string(settings_.patience) + " epochs\n"
                                     : "Time limit of " + std::to_string(settings_.time) + " h reached\n");
    return EpochEnd{std::nullopt, true};
  }
  return EpochEnd{};
}

// Validation of the EMA weights on rank 0; a pending stop skips it (the grace period is for the checkpoint).
void TrainingRun::validate_epoch(bool final_epoch, DetectionResults& metrics, std::vector<double>& val_loss) {
  if (!(settings_.val || final_epoch) || pending_stop_ != StopReason::kNone || !is_main_) return;
  ValConfig val_config;
  val_config.single_cls = settings_.loader.single_cls;
  DetectionValidator validator(nc_, names_, val_config);
  // Under autocast as the training forward (float16 on CUDA as the reference validates during training, bfloat16 on
  // a CPU that has it); the final validation of best.pt below is float32 on CPU.
  app::run_validation(core_->ema_model(), *val_loader_, validator, &core_->loss(), device_, settings_.channels_last,
                      core_->autocast(), "      val");
  metrics = validator.results();
  val_loss = validator.mean_loss();
  console_->out() << validator.table();
}

void TrainingRun::save_epoch_checkpoints(int64_t epoch, bool improved) {
  checkpoints_.wait();  // the previous epoch's files: at most one epoch pending, and its error surfaces here
  const int64_t global_iteration = (epoch + 1) * batches_per_epoch_;
  save(last_pt_, epoch + 1, 0, global_iteration, true, false);
  if (improved) save(best_pt_, epoch + 1, 0, global_iteration, false, false);
  if (settings_.save_period > 0 && (epoch + 1) % settings_.save_period == 0) {
    save(run_dir_ / "weights" / ("epoch" + std::to_string(epoch + 1) + ".pt"), epoch + 1, 0, global_iteration, false,
         false);
  }
}

// ---------------------------------------------------------------------------------------------------- finish

int TrainingRun::finish() {
  if (!is_main_) {
    report_cost("completed");
    return kExitCompleted;
  }
  // Final validation of best.pt with the per-class table.
  checkpoints_.wait();
  if (settings_.save && fs::exists(best_pt_)) {
    console_->out() << "\nValidating " << best_pt_.string() << "\n";
    LoadedModel best = load_any_model(best_pt_.string());
    prepare_for_inference(best.model, device_);
    if (settings_.channels_last) to_channels_last(*best.model);
    ValConfig val_config;
    val_config.single_cls = settings_.loader.single_cls;
    val_config.save_json = settings_.save_json;
    DetectionValidator validator(nc_, names_, val_config);
    app::run_validation(best.model, *val_loader_, validator, nullptr, device_, settings_.channels_last,
                        settings_.amp && device_.is_cuda(), "      val", settings_.plots ? run_dir_ : fs::path(),
                        names_);
    console_->out() << validator.table();
    if (settings_.save_json) validator.write_json((run_dir_ / "predictions.json").string());
    if (settings_.plots) {
      app::try_plot("validation curves", [&] {
        plot_validation(run_dir_.string(), validator.results().per_class, validator.confusion().matrix(), names_);
      });
    }
  }
  lease_->release(quota::Outcome::kCompleted);
  report_cost("completed");
  const double total_s = seconds_since(run_start_);
  console_->out() << "\n"
                  << settings_.epochs - start_epoch_ << " epochs completed in " << std::fixed << std::setprecision(3)
                  << total_s / 3600.0 << " hours (" << std::setprecision(1)
                  << (train_seconds_ > 0 ? images_seen_ / train_seconds_ : 0)
                  << " training images/s). Results saved to " << run_dir_.string() << "\n";
  return kExitCompleted;
}

// ---------------------------------------------------------------------------------------------------- shared

void TrainingRun::save(const fs::path& path, int64_t epoch, int64_t iteration_in_epoch, int64_t global_iteration,
                       bool with_optimizer, bool with_grads) {
  if (!is_main_) return;
  TrainingCore& core = *core_;
  CheckpointState state;
  state.epoch = epoch;
  state.iteration_in_epoch = iteration_in_epoch;
  state.global_iteration = global_iteration;
  state.batch = batch_;
  state.schedule = core.schedule().state();
  state.optimizer_choice = core.built_optimizer().choice;
  state.best_fitness = best_fitness_;
  state.has_best_fitness = has_best_;
  state.settings_text = app::encode_meta(meta_);
  state.rng = capture_torch_rng();
  state.has_grad_scaler = core.grad_scaler().enabled();
  state.grad_scaler = core.grad_scaler().state();
  CheckpointSources sources;
  sources.model = core.model().ptr().get();
  sources.ema = &core.ema();
  sources.optimizer = with_optimizer ? &core.optimizer() : nullptr;
  sources.include_grads = with_grads;
  sources.ultralytics = app::ultralytics_view(meta_);
  // Written and fsynced on the writer's thread while training goes on; encoded there too from a copy of the state
  // as it is now where a core is free for it, else here (threads.h).
  if (encode_in_background_) {
    auto snapshot = std::make_shared<const CheckpointSnapshot>(snapshot_checkpoint(state, sources));
    checkpoints_.write(path.string(), [snapshot] { return encode_snapshot(*snapshot); });
  } else {
    checkpoints_.write(path.string(), encode_checkpoint(state, sources));
  }
}

// The lease's telemetry says when the last checkpoint reached the disk (on the writer's thread).
void TrainingRun::note_checkpoint_written() {
  lease_->telemetry().last_checkpoint_ms.store(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
}

// What the run cost, printed and stored as cost.json at every exit of the loop.
void TrainingRun::report_cost(const std::string& outcome) {
  const double wall = seconds_since(run_start_);
  const int gpus = device_.is_cuda() ? std::max(1, dist_.world_size()) : 0;
  nlohmann::json cost;
  cost["outcome"] = outcome;
  cost["wall_seconds"] = wall;
  cost["gpu_hours"] = wall / 3600.0 * gpus;
  const double training_wall = seconds_since(train_start_);  // epochs including validation
  cost["images_per_second"] = training_wall > 0 ? images_seen_ / training_wall : 0.0;
  cost["busy_fraction"] = training_wall > 0 ? busy_seconds_ / training_wall : 0.0;
  cost["peak_memory_gib"] = static_cast<double>(run_meter_->peak_bytes()) / kBytesPerGib;
  cost["lease_memory_gib"] = lease_gib_;
  cost["lease_id"] = lease_->id();
  cost["batch"] = batch_;
  cost["device"] = device_.str();
  if (is_main_) app::write_text(run_dir_ / "cost.json", cost.dump(2) + "\n");
  console_->printf("Cost: %.2f GPU-hours, %.1f images/s, busy %.0f%% of the time, peak memory %.2f GiB%s\n",
                   cost["gpu_hours"].get<double>(), cost["images_per_second"].get<double>(),
                   100.0 * cost["busy_fraction"].get<double>(), cost["peak_memory_gib"].get<double>(),
                   lease_gib_ > 0 ? (" of a " + std::to_string(lease_gib_).substr(0, 5) + " GiB lease").c_str() : "");
}

}  // namespace yolo8
