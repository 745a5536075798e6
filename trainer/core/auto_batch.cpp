#include "trainer/core/auto_batch.h"

#include <nlohmann/json.hpp>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <stdexcept>

#include "trainer/core/optimizer.h"

namespace yolo8 {

namespace {

std::string gib(double bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.3f GiB", bytes / kBytesPerGib);
  return text;
}

// c10 messages carry a backtrace after the first line.
std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

void check_options(const AutoBatchOptions& options, double budget_bytes) {
  if (!(budget_bytes > 0.0) || !std::isfinite(budget_bytes)) {
    throw std::invalid_argument("auto-batch: memory budget must be a positive number of bytes");
  }
  if (!(options.budget_fraction > 0.0 && options.budget_fraction <= 1.0)) {
    throw std::invalid_argument("auto-batch: budget fraction must be in (0, 1], got " +
                                std::to_string(options.budget_fraction));
  }
  if (!(options.safety_margin > 0.0 && options.safety_margin <= 1.0)) {
    throw std::invalid_argument("auto-batch: safety margin must be in (0, 1], got " +
                                std::to_string(options.safety_margin));
  }
  if (options.profile_batches.empty()) {
    throw std::invalid_argument("auto-batch: profile batches must not be empty");
  }
  for (size_t i = 0; i < options.profile_batches.size(); ++i) {
    if (options.profile_batches[i] < 1 || (i > 0 && options.profile_batches[i] <= options.profile_batches[i - 1])) {
      throw std::invalid_argument("auto-batch: profile batches must be increasing and >= 1");
    }
  }
  if (options.max_batch < 1 || options.max_verify_steps < 0 || options.validation_batch_factor < 1 ||
      options.nominal_batch < 1 || options.imgsz < 1) {
    throw std::invalid_argument(
        "auto-batch: max_batch, nominal_batch, validation_batch_factor and imgsz must be >= 1, "
        "max_verify_steps >= 0");
  }
}

struct Measurement {
  bool out_of_memory = false;
  int64_t peak_bytes = 0;  // max of the train step and the validation step
};

}  // namespace

int64_t measure_peak_bytes(MemoryMeter& meter, const std::function<void()>& fn) {
  meter.reset_peak();
  fn();
  return meter.peak_bytes();
}

BatchSpec parse_batch_spec(double batch) {
  BatchSpec spec;
  if (batch == -1.0) {
    spec.automatic = true;
    spec.budget_fraction = 1.0;
  } else if (batch > 0.0 && batch < 1.0) {
    spec.automatic = true;
    spec.budget_fraction = batch;
  } else if (batch >= 1.0 && batch == std::floor(batch) && batch <= 1e6) {
    spec.fixed_batch = static_cast<int>(batch);
  } else {
    throw std::invalid_argument("batch=" + std::to_string(batch) +
                                ": expected an integer >= 1, -1 (auto) or a fraction of the memory "
                                "budget in (0, 1)");
  }
  return spec;
}

AutoBatchResult choose_batch(const StepFn& step, double budget_bytes, const AutoBatchOptions& options) {
  check_options(options, budget_bytes);
  if (!step) {
    throw std::invalid_argument("auto-batch: no training step given");
  }
  AutoBatchResult result;
  const double budget = budget_bytes * options.budget_fraction;
  const double target = budget * options.safety_margin;
  result.budget_bytes = budget;
  auto log = [&](const std::string& line) {
    if (options.log) {
      options.log(line);
    }
  };

  std::map<int, Measurement> measured;
  auto measure = [&](int batch) {
    Measurement m;
    const int val_batch = batch * options.validation_batch_factor;
    try {
      const int64_t train_peak = step(batch);
      result.train_samples.push_back({batch, train_peak});
      m.peak_bytes = train_peak;
      if (options.validation_step) {
        const int64_t val_peak = options.validation_step(val_batch);
        result.validation_samples.push_back({val_batch, val_peak});
        m.peak_bytes = std::max(m.peak_bytes, val_peak);
      }
    } catch (const std::exception& e) {
      if (!is_out_of_memory(e)) {
        throw;
      }
      m.out_of_memory = true;
      release_cached_memory(options.device);
      log("auto-batch: batch " + std::to_string(batch) + " ran out of memory: " + first_line(e.what()));
    }
    if (!m.out_of_memory) {
      log("auto-batch: batch " + std::to_string(batch) + " peak " + gib(static_cast<double>(m.peak_bytes)) + " of " +
          gib(budget));
    }
    measured[batch] = m;
    return m;
  };
  auto fits = [&](const Measurement& m) { return !m.out_of_memory && static_cast<double>(m.peak_bytes) <= budget; };

  int best = 0;
  int64_t best_peak = 0;
  auto accept = [&](int batch, const Measurement& m) {
    if (fits(m) && batch > best) {
      best = batch;
      best_peak = m.peak_bytes;
    }
  };

  // Smallest batch known not to fit.
  int too_big = options.max_batch + 1;
  auto reject = [&](int batch) { too_big = std::min(too_big, batch); };

  for (const int batch : options.profile_batches) {
    if (batch > options.max_batch) {
      break;
    }
    const Measurement m = measure(batch);
    accept(batch, m);
    if (!fits(m)) {
      reject(batch);
    }
    // Larger profile batches would only exceed the target further.
    if (m.out_of_memory || static_cast<double>(m.peak_bytes) > target) {
      break;
    }
  }

  auto refit_and_predict = [&]() {
    if (result.train_samples.empty()) {
      return 0;
    }
    result.fit = fit_memory(result.train_samples, result.validation_samples, options.imgsz);
    result.fit.validation_batch_factor = options.validation_batch_factor;
    const int predicted = max_batch_within(result.fit, budget, options.imgsz, options.safety_margin, options.max_batch);
    return std::min(predicted, too_big - 1);
  };

  int candidate = refit_and_predict();
  if (!result.train_samples.empty()) {
    log("auto-batch: fit " + gib(result.fit.train.fixed_bytes) + " + " + gib(result.fit.train.per_image_bytes) +
        " per image; predicted batch " + std::to_string(candidate));
  }
  // Verify by real steps: up while the refit says there is room, down between the largest batch that
  // fit and the smallest that did not.
  for (int i = 0; i < options.max_verify_steps && candidate > best && measured.count(candidate) == 0; ++i) {
    const Measurement m = measure(candidate);
    accept(candidate, m);
    if (fits(m)) {
      const int next = refit_and_predict();
      if (next <= candidate) {
        break;
      }
      candidate = next;
      continue;
    }
    ++result.steps_down;
    reject(candidate);
    refit_and_predict();  // keeps the over-budget sample in the fit
    int next = (best + candidate) / 2;
    const double rise = static_cast<double>(m.peak_bytes - best_peak);
    if (!m.out_of_memory && best > 0 && rise > 0.0) {
      // Secant through the largest fitting and this failing step, aimed at the target.
      next = best + static_cast<int>(std::floor((target - static_cast<double>(best_peak)) * (candidate - best) / rise));
    }
    candidate = std::min(next, too_big - 1);
  }

  // Nothing verified yet: halve from the smallest batch that failed until one fits.
  if (best == 0) {
    int batch = measured.empty() ? 1 : measured.begin()->first / 2;
    for (; batch >= 1; batch /= 2) {
      if (measured.count(batch) == 0) {
        const Measurement m = measure(batch);
        accept(batch, m);
        if (best > 0) {
          break;
        }
        ++result.steps_down;
      }
    }
  }
  if (best == 0) {
    throw OutOfMemory("auto-batch: not even batch 1 fits in the memory budget of " + gib(budget));
  }

  if (!result.train_samples.empty()) {
    result.fit = fit_memory(result.train_samples, result.validation_samples, options.imgsz);
    result.fit.validation_batch_factor = options.validation_batch_factor;
  }
  result.batch = best;
  result.measured_peak_bytes = best_peak;
  result.predicted_peak_bytes = result.fit.predict_peak_bytes(best, options.imgsz);
  // The trainer's own rule (round half to even), so the summary states what the run will do.
  OptimSettings nominal;
  nominal.nbs = options.nominal_batch;
  result.accumulate = static_cast<int>(plan_batch(nominal, best).accumulate);
  log("auto-batch: chose batch " + std::to_string(best) + " (measured peak " + gib(static_cast<double>(best_peak)) +
      ", predicted " + gib(result.predicted_peak_bytes) + ", budget " + gib(budget) + "), accumulate " +
      std::to_string(result.accumulate));
  return result;
}

std::string format_auto_batch_summary(const AutoBatchResult& result) {
  return "memory budget " + gib(result.budget_bytes) + ": batch " + std::to_string(result.batch) + ", accumulate " +
         std::to_string(result.accumulate) + ", predicted peak " + gib(result.predicted_peak_bytes) +
         ", measured peak " + gib(static_cast<double>(result.measured_peak_bytes));
}

OomGuard::OomGuard(c10::Device device, Report report) : device_(device), report_(std::move(report)) {}

void OomGuard::run(int64_t images, const std::function<void(int64_t passes)>& fn, const std::function<void()>& undo) {
  if (images < 1) {
    throw std::invalid_argument("out-of-memory guard: a step needs >= 1 image, got " + std::to_string(images));
  }
  const auto per_pass = [&] { return (images + passes_ - 1) / passes_; };
  for (;;) {
    try {
      fn(passes_);
      return;
    } catch (const std::exception& e) {
      const int64_t from = per_pass();
      if (!is_out_of_memory(e) || from <= 1) throw;
      if (undo) undo();
      release_cached_memory(device_);
      passes_ *= 2;
      ++splits_;
      const std::string message = first_line(e.what());
      if (report_) {
        report_(from, per_pass(), message);
      } else {
        std::cerr << "out of memory at " << from << " images per pass, retrying in passes of " << per_pass() << " ("
                  << message << ")\n";
      }
    }
  }
}

namespace {

void synchronize(const MemoryMeter& meter) {
  if (meter.device().is_cuda()) {
    torch::cuda::synchronize(meter.device().has_index() ? meter.device().index() : -1);
  }
}

}  // namespace

std::vector<StepProfile> profile_steps(MemoryMeter& meter, const std::function<void(int batch)>& step,
                                       const std::vector<int>& batches, int imgsz, const ProfileOptions& options) {
  if (options.warmup_steps < 0 || options.timed_steps < 1) {
    throw std::invalid_argument("profile: warmup steps must be >= 0 and timed steps >= 1");
  }
  std::vector<StepProfile> rows;
  for (const int batch : batches) {
    if (batch < 1) {
      throw std::invalid_argument("profile: batch sizes must be >= 1, got " + std::to_string(batch));
    }
    StepProfile row;
    row.batch = batch;
    row.imgsz = imgsz;
    std::vector<double> seconds;
    try {
      synchronize(meter);
      meter.reset_peak();
      for (int i = 0; i < options.warmup_steps + options.timed_steps; ++i) {
        const auto start = std::chrono::steady_clock::now();
        step(batch);
        synchronize(meter);
        if (i >= options.warmup_steps) {
          seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
        }
      }
      const MemoryStats stats = meter.stats();
      row.peak_bytes = stats.peak_bytes;
      row.reserved_peak_bytes = stats.reserved_peak_bytes;
      if (options.process_bytes) {
        const int64_t process = options.process_bytes();
        if (process >= 0) {
          row.process_bytes = process;
          row.process_overhead_bytes = process - stats.reserved_bytes;
        }
      }
      std::sort(seconds.begin(), seconds.end());
      row.step_seconds = seconds[seconds.size() / 2];
      row.images_per_second = row.step_seconds > 0.0 ? batch / row.step_seconds : 0.0;
    } catch (const std::exception& e) {
      if (!is_out_of_memory(e)) {
        throw;
      }
      row.out_of_memory = true;
      release_cached_memory(meter.device());
    }
    rows.push_back(row);
    if (row.out_of_memory && options.stop_at_out_of_memory) {
      break;
    }
  }
  return rows;
}

MemoryFit fit_profile(const std::vector<StepProfile>& rows) {
  std::vector<MemorySample> samples;
  int imgsz = 0;
  for (const StepProfile& row : rows) {
    if (row.out_of_memory) {
      continue;
    }
    if (imgsz != 0 && row.imgsz != imgsz) {
      throw std::invalid_argument("profile fit: rows mix image sizes " + std::to_string(imgsz) + " and " +
                                  std::to_string(row.imgsz));
    }
    imgsz = row.imgsz;
    samples.push_back({row.batch, row.peak_bytes});
  }
  if (samples.empty()) {
    throw std::invalid_argument("profile fit: no batch fitted in memory");
  }
  return fit_memory(samples, {}, imgsz);
}

std::string format_profile_table(const std::string& variant, const std::vector<StepProfile>& rows) {
  std::string text;
  char line[160];
  std::snprintf(line, sizeof(line), "%-10s %6s %6s %10s %12s %10s %10s\n", "variant", "imgsz", "batch", "peak GiB",
                "reserved GiB", "ms/step", "images/s");
  text += line;
  for (const StepProfile& row : rows) {
    if (row.out_of_memory) {
      std::snprintf(line, sizeof(line), "%-10s %6d %6d %10s %12s %10s %10s\n", variant.c_str(), row.imgsz, row.batch,
                    "OOM", "-", "-", "-");
    } else {
      std::snprintf(line, sizeof(line), "%-10s %6d %6d %10.3f %12.3f %10.1f %10.1f\n", variant.c_str(), row.imgsz,
                    row.batch, row.peak_bytes / kBytesPerGib, row.reserved_peak_bytes / kBytesPerGib,
                    row.step_seconds * 1000.0, row.images_per_second);
    }
    text += line;
  }
  return text;
}

std::string profile_json(const std::string& variant, const std::string& device, const std::vector<StepProfile>& rows) {
  nlohmann::json out;
  out["variant"] = variant;
  out["device"] = device;
  out["imgsz"] = rows.empty() ? 0 : rows.front().imgsz;
  out["rows"] = nlohmann::json::array();
  bool any_fit = false;
  for (const StepProfile& row : rows) {
    any_fit = any_fit || !row.out_of_memory;
    out["rows"].push_back({{"batch", row.batch},
                           {"imgsz", row.imgsz},
                           {"out_of_memory", row.out_of_memory},
                           {"peak_bytes", row.peak_bytes},
                           {"reserved_peak_bytes", row.reserved_peak_bytes},
                           {"step_seconds", row.step_seconds},
                           {"images_per_second", row.images_per_second}});
    if (row.process_bytes >= 0) {
      out["rows"].back()["process_bytes"] = row.process_bytes;
      out["rows"].back()["process_overhead_bytes"] = row.process_overhead_bytes;
    }
  }
  if (any_fit) {
    const MemoryFit fit = fit_profile(rows);
    out["fit"] = {{"fixed_gib", fit.train.fixed_bytes / kBytesPerGib},
                  {"per_image_gib", fit.train.per_image_bytes / kBytesPerGib},
                  {"reference_imgsz", fit.reference_imgsz}};
  }
  return out.dump(2);
}

}  // namespace yolo8
