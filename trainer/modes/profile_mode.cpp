#include "trainer/modes/profile_mode.h"

#include <unistd.h>

#include <torch/version.h>

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>

#include "common/exit_codes.h"
#include "trainer/batch/auto_batch_profile.h"
#include "trainer/batch/batch_size.h"
#include "trainer/core/atomic_file.h"
#include "trainer/core/autocast.h"
#include "trainer/core/memory_meter.h"
#include "trainer/core/memory_model.h"
#include "trainer/core/stop_signal.h"
#include "trainer/core/synthetic_step.h"
#include "trainer/modes/mode_args.h"
#include "trainer/modes/modes.h"
#include "trainer/runtime/run_dir.h"
#include "trainer/runtime/threads.h"
#include "trainer/runtime/utilisation.h"

namespace yolo8 {
namespace fs = std::filesystem;

int run_profile(const Settings& settings, const std::vector<std::string>& variants, const std::vector<int>& batches) {
  configure_threads(settings);
  const torch::Device device = profile_device(settings);
  const fs::path run_dir =
      make_run_dir(project_dir(settings.project, settings.task), "profile", settings.name, settings.exist_ok);
  MemoryMeter meter(device);
  MemoryTable table;
  table.reference_imgsz = 640;
  const std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof(date), "%Y-%m-%d", std::gmtime(&now));
  table.source = "yolo8 profile at imgsz " + std::to_string(settings.loader.imgsz) +
                 (device.is_cuda() ? "" : " (CPU: the instrumented allocator's count)");
  table.provenance.device = device_name(device);
  table.provenance.precision = !(settings.amp && device.is_cuda()) ? "float32"  // profiles time the float32 step on CPU
                               : settings.amp_dtype == "bfloat16"  ? "amp_bfloat16"
                                                                   : "amp";
  table.provenance.libtorch = TORCH_VERSION;
  table.provenance.date = date;
  ProfileOptions options;
  // nvidia-smi's view of this process (CUDA context and library workspaces included), beside the allocator's.
  std::unique_ptr<Nvml> nvml = device.is_cuda() ? Nvml::load() : nullptr;
  const std::optional<std::string> nvml_device =
      nvml ? cuda_device_uuid(device.has_index() ? device.index() : 0) : std::nullopt;
  if (nvml && nvml_device) {
    const auto pid = static_cast<unsigned int>(getpid());
    options.process_bytes = [&nvml, &nvml_device, pid]() -> int64_t {
      const std::optional<double> gib = nvml->process_memory_gib(*nvml_device, pid);
      return gib ? static_cast<int64_t>(*gib * kBytesPerGib) : -1;
    };
  }
  const fs::path json_path = run_dir / "profile.json";
  const std::string table_path = settings.out.empty() ? (run_dir / "memory-table.yaml").string() : settings.out;
  std::string json;
  for (size_t v = 0; v < variants.size(); ++v) {
    const std::string& variant = variants[v];
    const ModelConfig config = load_model_config(variant, 80);
    std::vector<StepProfile> rows;
    {
      SyntheticStepRunner runner(config, settings.loader.imgsz, 8, device, settings.channels_last, settings.amp,
                                 cuda_autocast_dtype(settings.amp_dtype));
      rows = profile_steps(
          meter, [&](int batch) { runner.train_step(batch); }, batches, settings.loader.imgsz, options);
    }
    // The next variant starts from an empty cache, as a fresh process would.
    release_cached_memory(device);
    std::cout << format_profile_table(variant, rows) << std::flush;
    json += (v ? "," : "") + profile_json(variant, device.str(), rows);
    bool any_fit = false;
    for (const auto& row : rows) {
      any_fit = any_fit || !row.out_of_memory;
      // The largest seen: a share must cover the context and the libraries' workspaces at any batch.
      if (row.process_overhead_bytes >= 0) {
        table.process_overhead_gib =
            std::max(table.process_overhead_gib, static_cast<double>(row.process_overhead_bytes) / kBytesPerGib);
      }
    }
    if (any_fit) table.variants.push_back(to_table_row(fs::path(variant).stem().string(), fit_profile(rows)));
    // Written after each variant: a profile stopped at its time limit keeps what it measured.
    write_file_atomic(json_path.string(), "[" + json + "]\n");
    write_memory_table(table_path, table);
    std::cout << "Profile written to " << json_path.string() << "; memory table (for quotad) to " << table_path << " ("
              << v + 1 << " of " << variants.size() << " variants)\n"
              << std::flush;
  }
  return kExitCompleted;
}

int profile_mode(const CommandLine& command) {
  // batch and variants are lists here: batch=1,2,4,8 variants=n,s,m.
  auto pairs = command.pairs;
  auto keys = take_keys(pairs, {"batch", "variants"});
  Settings settings = resolve_settings(pairs, "profile");
  const std::string batch_list = keys.count("batch") ? keys["batch"] : "1,2,4,8,16";
  // One value that batch= reads as auto (auto, -1, a fraction) sizes the batch; anything else is a list.
  bool auto_batch = false;
  if (batch_list.find(',') == std::string::npos) {
    Settings single = settings;
    set_setting(single, "batch", batch_list, "command line");
    auto_batch = parse_batch_spec(single.batch).automatic;
    if (auto_batch) settings = single;
  }
  std::vector<int> batches;
  if (!auto_batch) batches = parse_int_list_setting("batch", batch_list);
  for (int batch : batches) {
    if (batch < 1) throw SettingsError("setting 'batch' of profile must list batch sizes >= 1");
  }
  std::vector<std::string> variants;
  if (keys.count("variants")) {
    std::string list = keys["variants"];
    for (char& c : list) c = (c == ',' || c == '[' || c == ']') ? ' ' : c;
    std::istringstream words(list);
    std::string word;
    while (words >> word) variants.push_back(word.size() == 1 ? "yolov8" + word + ".yaml" : word);
  } else {
    variants.push_back(settings.model);
  }
  if (auto_batch) {
    const auto rows = run_auto_batch_profile(settings, variants);
    for (const auto& row : rows) {
      if (!row.fits || row.out_of_memory_after > 0) return kExitFailure;
    }
    return kExitCompleted;
  }
  return run_profile(settings, variants, batches);
}

}  // namespace yolo8
