#include "trainer/app/run_dir.h"

#include <cstdio>
#include <iomanip>
#include <sstream>
#include <stdexcept>

namespace yolo8 {
namespace fs = std::filesystem;

fs::path make_run_dir(const std::string& project, const std::string& mode, const std::string& name,
                      bool exist_ok) {
  const std::string base_name = name.empty() ? mode : name;
  const fs::path parent = fs::path(project) / mode;
  fs::path dir = parent / base_name;
  if (!exist_ok) {
    for (int suffix = 2; fs::exists(dir); ++suffix) dir = parent / (base_name + std::to_string(suffix));
  }
  std::error_code error;
  fs::create_directories(dir / "weights", error);
  if (error) throw std::runtime_error("cannot create run folder " + dir.string() + ": " + error.message());
  return dir;
}

fs::path latest_last_checkpoint(const std::string& project, const std::string& mode) {
  const fs::path parent = fs::path(project) / mode;
  fs::path best;
  fs::file_time_type best_time{};
  std::error_code error;
  if (!fs::is_directory(parent, error)) return {};
  for (const auto& run : fs::directory_iterator(parent, error)) {
    const fs::path candidate = run.path() / "weights" / "last.pt";
    if (!fs::is_regular_file(candidate, error)) continue;
    const auto time = fs::last_write_time(candidate, error);
    if (best.empty() || time > best_time) {
      best = candidate;
      best_time = time;
    }
  }
  return best;
}

ResultsCsv::ResultsCsv(const fs::path& path) : path_(path) {
  if (fs::exists(path_)) return;
  std::ofstream out(path_);
  if (!out) throw std::runtime_error("cannot write " + path_.string());
  const auto& names = columns();
  for (size_t i = 0; i < names.size(); ++i) out << (i ? "," : "") << std::setw(i ? 25 : 5) << names[i];
  out << "\n";
}

const std::vector<std::string>& ResultsCsv::columns() {
  // The reference's names first, so existing notebooks and plots read the file; then yolo8's own.
  static const std::vector<std::string> kColumns = {
      "epoch",         "train/box_loss",       "train/cls_loss",        "train/dfl_loss",
      "metrics/precision(B)", "metrics/recall(B)", "metrics/mAP50(B)", "metrics/mAP50-95(B)",
      "val/box_loss",  "val/cls_loss",         "val/dfl_loss",          "lr/pg0",
      "lr/pg1",        "lr/pg2",               "time",                  "gpu_mem_gib",
      "gpu_hours",     "images_per_s"};
  return kColumns;
}

void ResultsCsv::append(const std::vector<double>& values) {
  if (values.size() != columns().size()) {
    throw std::logic_error("results.csv row has " + std::to_string(values.size()) + " values, expected " +
                           std::to_string(columns().size()));
  }
  std::ofstream out(path_, std::ios::app);
  for (size_t i = 0; i < values.size(); ++i) {
    out << (i ? "," : "");
    if (i == 0) {
      out << std::setw(5) << static_cast<long long>(values[i]);
    } else {
      std::ostringstream cell;
      cell << std::setprecision(6) << values[i];
      out << std::setw(25) << cell.str();
    }
  }
  out << "\n";
}

void ResultsCsv::keep_epochs_up_to(int last_epoch) {
  std::ifstream in(path_);
  if (!in) return;
  std::string header, line, kept;
  std::getline(in, header);
  while (std::getline(in, line)) {
    if (std::stoi(line.substr(0, line.find(','))) <= last_epoch) kept += line + "\n";
  }
  in.close();
  std::ofstream(path_, std::ios::trunc) << header << "\n" << kept;
}

}  // namespace yolo8
