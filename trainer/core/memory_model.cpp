#include "trainer/core/memory_model.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <system_error>

#include "trainer/core/atomic_file.h"

namespace yolo8 {

double imgsz_scale(int imgsz, int reference_imgsz) {
  if (imgsz <= 0 || reference_imgsz <= 0) {
    throw std::invalid_argument("image sizes must be > 0, got imgsz=" + std::to_string(imgsz) +
                                " reference_imgsz=" + std::to_string(reference_imgsz));
  }
  const double ratio = static_cast<double>(imgsz) / reference_imgsz;
  return ratio * ratio;
}

LinearMemory fit_linear_memory(const std::vector<MemorySample>& samples) {
  if (samples.empty()) {
    throw std::invalid_argument("memory fit needs at least one measured sample");
  }
  double mean_b = 0.0;
  double mean_p = 0.0;
  double max_p = 0.0;
  for (const MemorySample& s : samples) {
    if (s.batch < 1) {
      throw std::invalid_argument("memory sample batch must be >= 1, got " + std::to_string(s.batch));
    }
    mean_b += s.batch;
    mean_p += static_cast<double>(s.peak_bytes);
    max_p = std::max(max_p, static_cast<double>(s.peak_bytes));
  }
  mean_b /= samples.size();
  mean_p /= samples.size();
  double sxx = 0.0;
  double sxy = 0.0;
  for (const MemorySample& s : samples) {
    sxx += (s.batch - mean_b) * (s.batch - mean_b);
    sxy += (s.batch - mean_b) * (static_cast<double>(s.peak_bytes) - mean_p);
  }
  LinearMemory fit;
  if (sxx <= 0.0) {
    // One batch size only: the split is unknown, so assume everything grows with the batch.
    fit.per_image_bytes = max_p / mean_b;
    return fit;
  }
  const double slope = sxy / sxx;
  if (slope <= 0.0) {
    fit.fixed_bytes = max_p;
    return fit;
  }
  fit.per_image_bytes = slope;
  fit.fixed_bytes = mean_p - slope * mean_b;
  return fit;
}

double MemoryFit::train_peak_bytes(int batch, int imgsz) const {
  return train.at(batch, imgsz_scale(imgsz, reference_imgsz));
}

double MemoryFit::validation_peak_bytes(int batch, int imgsz) const {
  if (!has_validation) {
    return 0.0;
  }
  return validation.at(static_cast<double>(batch) * validation_batch_factor, imgsz_scale(imgsz, reference_imgsz));
}

double MemoryFit::predict_peak_bytes(int batch, int imgsz) const {
  return std::max(train_peak_bytes(batch, imgsz), validation_peak_bytes(batch, imgsz));
}

MemoryFit fit_memory(const std::vector<MemorySample>& train_samples,
                     const std::vector<MemorySample>& validation_samples, int reference_imgsz) {
  if (reference_imgsz <= 0) {
    throw std::invalid_argument("reference_imgsz must be > 0, got " + std::to_string(reference_imgsz));
  }
  MemoryFit fit;
  fit.reference_imgsz = reference_imgsz;
  fit.train = fit_linear_memory(train_samples);
  if (!validation_samples.empty()) {
    fit.has_validation = true;
    fit.validation = fit_linear_memory(validation_samples);
  }
  return fit;
}

int max_batch_within(const MemoryFit& fit, double budget_bytes, int imgsz, double safety_margin, int max_batch) {
  if (!(budget_bytes > 0.0)) {
    throw std::invalid_argument("memory budget must be > 0 bytes");
  }
  if (!(safety_margin > 0.0 && safety_margin <= 1.0)) {
    throw std::invalid_argument("safety margin must be in (0, 1], got " + std::to_string(safety_margin));
  }
  if (max_batch < 1) {
    throw std::invalid_argument("max batch must be >= 1, got " + std::to_string(max_batch));
  }
  const double limit = budget_bytes * safety_margin;
  if (fit.predict_peak_bytes(1, imgsz) > limit) {
    return 0;
  }
  // The prediction grows with the batch, so bisect for the last batch that fits.
  int lo = 1;
  int hi = max_batch;
  while (lo < hi) {
    const int mid = lo + (hi - lo + 1) / 2;
    if (fit.predict_peak_bytes(mid, imgsz) <= limit) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

const MemoryTableRow* MemoryTable::find(const std::string& variant) const {
  for (const MemoryTableRow& row : variants) {
    if (row.variant == variant) {
      return &row;
    }
  }
  return nullptr;
}

double MemoryTable::peak_gib(const std::string& variant, int batch, int imgsz) const {
  const MemoryTableRow* row = find(variant);
  if (row == nullptr) {
    throw std::out_of_range("memory table has no variant '" + variant + "'");
  }
  return row->fixed_gib + row->per_image_gib * imgsz_scale(imgsz, reference_imgsz) * batch;
}

MemoryTableRow to_table_row(const std::string& variant, const MemoryFit& fit, int table_reference_imgsz) {
  MemoryTableRow row;
  row.variant = variant;
  row.fixed_gib = std::max(fit.train.fixed_bytes, 0.0) / kBytesPerGib;
  row.per_image_gib =
      fit.train.per_image_bytes * imgsz_scale(table_reference_imgsz, fit.reference_imgsz) / kBytesPerGib;
  return row;
}

void write_memory_table(const std::string& path, const MemoryTable& table) {
  YAML::Emitter out;
  out.SetDoublePrecision(9);
  out << YAML::BeginMap;
  out << YAML::Key << "reference_imgsz" << YAML::Value << table.reference_imgsz;
  out << YAML::Key << "source" << YAML::Value << YAML::DoubleQuoted << table.source;
  const MemoryProvenance& from = table.provenance;
  if (!from.device.empty() || !from.precision.empty() || !from.libtorch.empty() || !from.date.empty()) {
    out << YAML::Key << "provenance" << YAML::Value << YAML::BeginMap;
    out << YAML::Key << "device" << YAML::Value << YAML::DoubleQuoted << from.device;
    out << YAML::Key << "precision" << YAML::Value << from.precision;
    out << YAML::Key << "libtorch" << YAML::Value << YAML::DoubleQuoted << from.libtorch;
    out << YAML::Key << "date" << YAML::Value << YAML::DoubleQuoted << from.date;
    out << YAML::EndMap;
  }
  if (table.process_overhead_gib >= 0) {
    out << YAML::Key << "process_overhead_gib" << YAML::Value << table.process_overhead_gib;
  }
  out << YAML::Key << "models" << YAML::Value << YAML::BeginMap;
  for (const MemoryTableRow& row : table.variants) {
    out << YAML::Key << row.variant << YAML::Value << YAML::Flow << YAML::BeginMap;
    out << YAML::Key << "fixed_gib" << YAML::Value << row.fixed_gib;
    out << YAML::Key << "per_image_gib" << YAML::Value << row.per_image_gib;
    out << YAML::EndMap;
  }
  out << YAML::EndMap << YAML::EndMap;
  if (!out.good()) {
    throw std::runtime_error("memory table " + path + ": cannot emit YAML: " + out.GetLastError());
  }
  // Replaced whole (a temporary file renamed over it): a profile rewrites it after each variant, and a profile
  // killed mid-write must leave the previous table, not half of one.
  try {
    write_file_atomic(path, std::string("# Training-step peak memory per variant: peak(batch, imgsz) = fixed_gib + "
                                        "per_image_gib * batch * (imgsz / reference_imgsz)^2\n") +
                                out.c_str() + "\n");
  } catch (const std::system_error& error) {
    throw std::runtime_error("memory table " + path + ": " + error.what());
  }
}

namespace {

std::string where(const std::string& path, const YAML::Node& node) {
  const YAML::Mark mark = node.Mark();
  return mark.line >= 0 ? path + ":" + std::to_string(mark.line + 1) : path;
}

double read_gib(const std::string& path, const YAML::Node& entry, const std::string& variant, const char* key) {
  const YAML::Node value = entry[key];
  const std::string name = "models." + variant + "." + key;
  if (!value) {
    throw std::runtime_error("memory table " + where(path, entry) + ": missing key '" + name + "'");
  }
  double number = 0.0;
  try {
    number = value.as<double>();
  } catch (const YAML::Exception&) {
    throw std::runtime_error("memory table " + where(path, value) + ": key '" + name + "' must be a number, got '" +
                             value.Scalar() + "'");
  }
  if (!std::isfinite(number) || number < 0.0) {
    throw std::runtime_error("memory table " + where(path, value) + ": key '" + name +
                             "' must be a finite number >= 0, got " + value.Scalar());
  }
  return number;
}

}  // namespace

MemoryTable read_memory_table(const std::string& path) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    throw std::runtime_error("memory table " + path + ": cannot open");
  } catch (const YAML::Exception& e) {
    throw std::runtime_error("memory table " + path + ":" + std::to_string(e.mark.line + 1) +
                             ": invalid YAML: " + e.msg);
  }
  if (!root.IsMap()) {
    throw std::runtime_error("memory table " + path + ": expected a mapping at the top level");
  }
  MemoryTable table;
  if (const YAML::Node ref = root["reference_imgsz"]) {
    try {
      table.reference_imgsz = ref.as<int>();
    } catch (const YAML::Exception&) {
      table.reference_imgsz = 0;
    }
    if (table.reference_imgsz <= 0) {
      throw std::runtime_error("memory table " + where(path, ref) +
                               ": key 'reference_imgsz' must be an integer > 0, got '" + ref.Scalar() + "'");
    }
  }
  if (const YAML::Node source = root["source"]) {
    if (!source.IsScalar()) {
      throw std::runtime_error("memory table " + where(path, source) + ": key 'source' must be text");
    }
    table.source = source.Scalar();
  }
  if (const YAML::Node provenance = root["provenance"]) {
    if (!provenance.IsMap()) {
      throw std::runtime_error("memory table " + where(path, provenance) +
                               ": key 'provenance' must be a mapping {device, precision, libtorch, date}");
    }
    const auto text = [&](const char* key) {
      const YAML::Node value = provenance[key];
      return value && value.IsScalar() ? value.Scalar() : std::string();
    };
    table.provenance = {text("device"), text("precision"), text("libtorch"), text("date")};
  }
  if (const YAML::Node overhead = root["process_overhead_gib"]) {
    double gib = -1.0;
    try {
      gib = overhead.as<double>();
    } catch (const YAML::Exception&) {
    }
    if (!std::isfinite(gib) || gib < 0.0) {
      throw std::runtime_error("memory table " + where(path, overhead) +
                               ": key 'process_overhead_gib' must be a finite number >= 0, got '" + overhead.Scalar() +
                               "'");
    }
    table.process_overhead_gib = gib;
  }
  const YAML::Node variants = root["models"];
  if (!variants) {
    throw std::runtime_error("memory table " + path + ": missing key 'models'");
  }
  if (!variants.IsMap()) {
    throw std::runtime_error("memory table " + where(path, variants) +
                             ": key 'models' must map a model name to {fixed_gib, per_image_gib}");
  }
  for (const auto& item : variants) {
    const std::string name = item.first.as<std::string>();
    const YAML::Node& entry = item.second;
    if (!entry.IsMap()) {
      throw std::runtime_error("memory table " + where(path, entry) + ": key 'models." + name +
                               "' must be a mapping {fixed_gib, per_image_gib}");
    }
    MemoryTableRow row;
    row.variant = name;
    row.fixed_gib = read_gib(path, entry, name, "fixed_gib");
    row.per_image_gib = read_gib(path, entry, name, "per_image_gib");
    table.variants.push_back(row);
  }
  return table;
}

}  // namespace yolo8
