#include "quota/core/memory_learning.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <map>
#include <stdexcept>
#include <tuple>

namespace yolo8::quota {

std::vector<ObservedRow> fit_observed(const std::vector<MemoryObservation>& observations) {
  std::map<std::tuple<std::string, std::string, bool, std::string>, std::vector<const MemoryObservation*>> groups;
  for (const auto& observation : observations) {
    if (observation.batch < 1 || observation.imgsz < 1 || !(observation.peak_gib > 0)) continue;
    groups[{observation.device, observation.model, observation.amp, observation.libtorch}].push_back(&observation);
  }
  std::vector<ObservedRow> rows;
  for (const auto& [key, samples] : groups) {
    ObservedRow row;
    std::tie(row.device, row.model, row.amp, row.libtorch) = key;
    row.samples = static_cast<int>(samples.size());
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    double max_per = 0;
    for (const MemoryObservation* sample : samples) {
      const double scale = (sample->imgsz / 640.0) * (sample->imgsz / 640.0);
      const double x = sample->batch * scale;  // images at 640
      sx += x;
      sy += sample->peak_gib;
      sxx += x * x;
      sxy += x * sample->peak_gib;
      max_per = std::max(max_per, sample->peak_gib / x);
    }
    const double n = row.samples;
    const double denominator = n * sxx - sx * sx;
    double slope = denominator > 1e-12 * std::max(1.0, n * sxx) ? (n * sxy - sx * sy) / denominator : 0;
    double intercept = (sy - slope * sx) / n;
    if (slope <= 0 || intercept < 0) {
      // no usable slope, or a negative fixed part: all of it per image, the largest ratio seen (an upper bound)
      slope = max_per;
      intercept = 0;
    }
    row.fixed_gib = intercept;
    row.per_image_gib = slope;
    rows.push_back(row);
  }
  return rows;
}

std::string observed_table_yaml(const std::vector<ObservedRow>& rows, const std::string& date,
                                double process_overhead_gib) {
  int samples = 0;
  for (const auto& row : rows) {
    if (row.device != rows.front().device || row.amp != rows.front().amp || row.libtorch != rows.front().libtorch) {
      const auto name = [](const ObservedRow& of) {
        return of.device + (of.amp ? ", amp" : ", float32") + ", LibTorch " +
               (of.libtorch.empty() ? std::string("unknown") : of.libtorch);
      };
      throw std::invalid_argument("memory table: rows of one device, precision and LibTorch version only (got " +
                                  name(rows.front()) + " and " + name(row) + ")");
    }
    samples += row.samples;
  }
  YAML::Emitter out;
  out.SetDoublePrecision(6);
  out << YAML::BeginMap;
  out << YAML::Key << "source" << YAML::Value
      << "observed: peaks from " + std::to_string(samples) + " heartbeat samples of real runs";
  out << YAML::Key << "reference_imgsz" << YAML::Value << 640;
  if (!rows.empty()) {
    out << YAML::Key << "provenance" << YAML::Value << YAML::Flow << YAML::BeginMap;
    out << YAML::Key << "device" << YAML::Value << YAML::DoubleQuoted << rows.front().device;
    out << YAML::Key << "precision" << YAML::Value << (rows.front().amp ? "amp" : "float32");
    if (!rows.front().libtorch.empty()) {
      out << YAML::Key << "libtorch" << YAML::Value << YAML::DoubleQuoted << rows.front().libtorch;
    }
    out << YAML::Key << "date" << YAML::Value << YAML::DoubleQuoted << date;
    out << YAML::EndMap;
  }
  if (process_overhead_gib >= 0) out << YAML::Key << "process_overhead_gib" << YAML::Value << process_overhead_gib;
  out << YAML::Key << "models" << YAML::Value << YAML::BeginMap;
  for (const auto& row : rows) {
    out << YAML::Key << row.model << YAML::Value << YAML::Flow << YAML::BeginMap;
    out << YAML::Key << "fixed_gib" << YAML::Value << row.fixed_gib;
    out << YAML::Key << "per_image_gib" << YAML::Value << row.per_image_gib;
    out << YAML::EndMap;
  }
  out << YAML::EndMap << YAML::EndMap;
  return std::string(
             "# Learned by quotad memory-table --observed: GiB = fixed_gib + per_image_gib * batch_per_gpu * "
             "(imgsz/640)^2\n") +
         out.c_str() + "\n";
}

}  // namespace yolo8::quota
