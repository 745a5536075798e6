#include "trainer/runtime/run_dir.h"

#include <cstdio>
#include <iomanip>
#include <sstream>
#include <stdexcept>

namespace yolo8 {
namespace fs = std::filesystem;

fs::path project_dir(const std::string& project, const std::string& task) {
  return project.empty() ? fs::path("runs") / task : fs::path(project);
}

fs::path make_run_dir(const fs::path& project_dir, const std::string& mode, const std::string& name, bool exist_ok) {
  const std::string base_name = name.empty() ? mode : name;
  fs::path dir = project_dir / base_name;
  if (!exist_ok) {
    for (int suffix = 2; fs::exists(dir); ++suffix) dir = project_dir / (base_name + std::to_string(suffix));
  }
  std::error_code error;
  fs::create_directories(mode == "train" ? dir / "weights" : dir, error);
  if (error) throw std::runtime_error("cannot create run folder " + dir.string() + ": " + error.message());
  return dir;
}

fs::path latest_last_checkpoint(const fs::path& project_dir) {
  fs::path best;
  fs::file_time_type best_time{};
  std::error_code error;
  if (!fs::is_directory(project_dir, error)) return {};
  for (const auto& run : fs::directory_iterator(project_dir, error)) {
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

namespace {

// The number columns after `epoch`: the reference's names first, so existing notebooks and plots read the file.
const std::vector<std::pair<const char*, double ResultsRow::*>>& number_columns() {
  static const std::vector<std::pair<const char*, double ResultsRow::*>> kColumns = {
      {"train/box_loss", &ResultsRow::train_box_loss},
      {"train/cls_loss", &ResultsRow::train_cls_loss},
      {"train/dfl_loss", &ResultsRow::train_dfl_loss},
      {"metrics/precision(B)", &ResultsRow::precision},
      {"metrics/recall(B)", &ResultsRow::recall},
      {"metrics/mAP50(B)", &ResultsRow::map50},
      {"metrics/mAP50-95(B)", &ResultsRow::map50_95},
      {"val/box_loss", &ResultsRow::val_box_loss},
      {"val/cls_loss", &ResultsRow::val_cls_loss},
      {"val/dfl_loss", &ResultsRow::val_dfl_loss},
      {"lr/pg0", &ResultsRow::lr_pg0},
      {"lr/pg1", &ResultsRow::lr_pg1},
      {"lr/pg2", &ResultsRow::lr_pg2},
      {"time", &ResultsRow::time},
      {"gpu_mem_gib", &ResultsRow::gpu_mem_gib},
      {"gpu_hours", &ResultsRow::gpu_hours},
      {"images_per_s", &ResultsRow::images_per_s},
  };
  return kColumns;
}

}  // namespace

const std::vector<std::string>& ResultsCsv::columns() {
  static const std::vector<std::string> kNames = [] {
    std::vector<std::string> names = {"epoch"};
    for (const auto& column : number_columns()) names.emplace_back(column.first);
    return names;
  }();
  return kNames;
}

void ResultsCsv::append(const ResultsRow& row) {
  std::ofstream out(path_, std::ios::app);
  out << std::setw(5) << row.epoch;
  for (const auto& column : number_columns()) {
    std::ostringstream cell;
    cell << std::setprecision(6) << row.*column.second;
    out << "," << std::setw(25) << cell.str();
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
