#include "trainer/batch/auto_batch_profile.h"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "models/model_yaml.h"
#include "trainer/batch/batch_size.h"
#include "trainer/core/atomic_file.h"
#include "trainer/core/auto_batch.h"
#include "trainer/core/autocast.h"
#include "trainer/core/memory_meter.h"
#include "trainer/core/memory_model.h"
#include "trainer/core/synthetic_step.h"
#include "trainer/runtime/run_dir.h"
#include "trainer/runtime/threads.h"

namespace yolo8 {
namespace fs = std::filesystem;

namespace {

constexpr int kConfirmationSteps = 3;
constexpr int kMaxBatch = 1024;  // no dataset here: only the memory limits the batch

AutoBatchProfileRow profile_variant(const std::string& variant, const Settings& settings, const torch::Device& device,
                                    double budget_bytes) {
  AutoBatchProfileRow row;
  row.variant = fs::path(variant).stem().string();
  const ModelConfig config = load_model_config(variant, 80);
  std::cout << row.variant << ": sizing the batch to " << budget_bytes / kBytesPerGib << " GiB\n";
  AutoBatchResult chosen;
  try {
    chosen = auto_batch_for(config, settings, device, budget_bytes, kMaxBatch);
  } catch (const OutOfMemory& error) {
    std::cout << row.variant << ": does not fit: " << error.what() << "\n";
    row.budget_bytes = budget_bytes;
    return row;
  }
  row.fits = true;
  row.batch = chosen.batch;
  row.accumulate = chosen.accumulate;
  row.budget_bytes = chosen.budget_bytes;
  row.predicted_peak_bytes = chosen.predicted_peak_bytes;
  row.verified_peak_bytes = static_cast<double>(chosen.measured_peak_bytes);
  row.verification_retries = chosen.steps_down;
  // What a real run does next: more steps at that batch (optimizer state now exists) and validation at 2x.
  MemoryMeter meter(device);
  SyntheticStepRunner runner(config, settings.loader.imgsz, 8, device, settings.channels_last, settings.amp,
                             cuda_autocast_dtype(settings.amp_dtype));
  int64_t peak = 0;
  double seconds = 0;
  for (int step = 0; step < kConfirmationSteps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    try {
      peak = std::max(peak, measure_peak_bytes(meter, [&] { runner.train_step(row.batch); }));
    } catch (const OutOfMemory&) {
      ++row.out_of_memory_after;
    }
#ifdef YOLO8_WITH_CUDA
    if (device.is_cuda()) torch::cuda::synchronize(device.index());
#endif
    if (step > 0) seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  try {
    peak = std::max(peak, measure_peak_bytes(meter, [&] { runner.validation_step(2 * row.batch); }));
  } catch (const OutOfMemory&) {
    ++row.out_of_memory_after;
  }
  row.confirmed_peak_bytes = static_cast<double>(peak);
  row.step_seconds = seconds / (kConfirmationSteps - 1);
  return row;
}

nlohmann::json to_json(const AutoBatchProfileRow& row) {
  return {{"variant", row.variant},
          {"fits", row.fits},
          {"batch", row.batch},
          {"accumulate", row.accumulate},
          {"budget_gib", row.budget_bytes / kBytesPerGib},
          {"predicted_peak_gib", row.predicted_peak_bytes / kBytesPerGib},
          {"verified_peak_gib", row.verified_peak_bytes / kBytesPerGib},
          {"confirmed_peak_gib", row.confirmed_peak_bytes / kBytesPerGib},
          {"confirmed_share_of_budget", row.budget_bytes > 0 ? row.confirmed_peak_bytes / row.budget_bytes : 0.0},
          {"verification_retries", row.verification_retries},
          {"out_of_memory_after", row.out_of_memory_after},
          {"step_seconds", row.step_seconds},
          {"images_per_second", row.step_seconds > 0 ? row.batch / row.step_seconds : 0.0}};
}

}  // namespace

std::string format_auto_batch_profile(const std::vector<AutoBatchProfileRow>& rows) {
  std::ostringstream out;
  char line[256];
  std::snprintf(line, sizeof(line), "%-10s %10s %6s %6s %12s %12s %12s %8s %8s %5s %9s\n", "variant", "budget GiB",
                "batch", "accum", "predict GiB", "verify GiB", "confirm GiB", "% budget", "retries", "OOMs",
                "images/s");
  out << line;
  for (const auto& row : rows) {
    if (!row.fits) {
      std::snprintf(line, sizeof(line), "%-10s %10.2f  batch 1 does not fit\n", row.variant.c_str(),
                    row.budget_bytes / kBytesPerGib);
    } else {
      std::snprintf(line, sizeof(line), "%-10s %10.2f %6d %6d %12.2f %12.2f %12.2f %7.0f%% %8d %5d %9.1f\n",
                    row.variant.c_str(), row.budget_bytes / kBytesPerGib, row.batch, row.accumulate,
                    row.predicted_peak_bytes / kBytesPerGib, row.verified_peak_bytes / kBytesPerGib,
                    row.confirmed_peak_bytes / kBytesPerGib, 100.0 * row.confirmed_peak_bytes / row.budget_bytes,
                    row.verification_retries, row.out_of_memory_after,
                    row.step_seconds > 0 ? row.batch / row.step_seconds : 0.0);
    }
    out << line;
  }
  return out.str();
}

std::vector<AutoBatchProfileRow> run_auto_batch_profile(const Settings& settings,
                                                        const std::vector<std::string>& variants) {
  configure_threads(settings);
  const torch::Device device = profile_device(settings);
  const double budget = memory_budget_bytes(settings, device);
  // The cap a leased run gets: going over it is an out-of-memory error, not a neighbour's problem.
  cap_memory_bytes(static_cast<int64_t>(budget), device);
  const fs::path run_dir =
      make_run_dir(project_dir(settings.project, settings.task), "profile", settings.name, settings.exist_ok);
  std::vector<AutoBatchProfileRow> rows;
  rows.reserve(variants.size());
  nlohmann::json json = {{"device", device.str()},
                         {"imgsz", settings.loader.imgsz},
                         {"budget_gib", budget / kBytesPerGib},
                         {"rows", nlohmann::json::array()}};
  const fs::path json_path = run_dir / "auto_batch.json";
  for (const auto& variant : variants) {
    rows.push_back(profile_variant(variant, settings, device, budget));
    release_cached_memory(device);  // the next variant sizes its batch from an empty cache, as a new run would
    // Written after each variant: a profile stopped at its time limit keeps what it measured.
    json["rows"].push_back(to_json(rows.back()));
    write_file_atomic(json_path.string(), json.dump(2) + "\n");
  }
  std::cout << "batch=auto at imgsz " << settings.loader.imgsz << " on " << device.str() << "\n"
            << format_auto_batch_profile(rows);
  std::cout << "Written to " << json_path.string() << "\n";
  return rows;
}

}  // namespace yolo8
