#pragma once
// Run folders as Ultralytics lays them out (`runs/detect/train`, `train2`, ... unless exist_ok) and the
// results.csv every run writes.

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace yolo8 {

// The folder holding the run folders: `project`, or runs/TASK when it is empty (runs/detect).
std::filesystem::path project_dir(const std::string& project, const std::string& task);

// project_dir/name (name "" = the mode: train, val, predict, profile), or name2, name3 ... when it exists and
// !exist_ok. Created; a train run's with weights/.
std::filesystem::path make_run_dir(const std::filesystem::path& project_dir, const std::string& mode,
                                   const std::string& name, bool exist_ok);

// The most recently written */weights/last.pt under project_dir, or "" if none.
std::filesystem::path latest_last_checkpoint(const std::filesystem::path& project_dir);

// One epoch of results.csv: the reference's columns, then yolo8's own.
struct ResultsRow {
  int epoch = 0;  // 1-based
  double train_box_loss = 0.0, train_cls_loss = 0.0, train_dfl_loss = 0.0;
  double precision = 0.0, recall = 0.0, map50 = 0.0, map50_95 = 0.0;
  double val_box_loss = 0.0, val_cls_loss = 0.0, val_dfl_loss = 0.0;
  double lr_pg0 = 0.0, lr_pg1 = 0.0, lr_pg2 = 0.0;  // the three parameter groups
  double time = 0.0;                                // seconds since the run started
  double gpu_mem_gib = 0.0;                         // peak tensor memory
  double gpu_hours = 0.0;
  double images_per_s = 0.0;
};

// Appends one row per epoch; writes the header when the file is new. Flushed per row so a crash keeps it.
class ResultsCsv {
 public:
  explicit ResultsCsv(const std::filesystem::path& path);
  // The header: epoch, then the number columns in ResultsRow's order.
  static const std::vector<std::string>& columns();
  void append(const ResultsRow& row);
  // Keeps only rows of epochs 1..last_epoch (a resumed run rewrites the epochs it repeats).
  void keep_epochs_up_to(int last_epoch);

 private:
  std::filesystem::path path_;
};

}  // namespace yolo8
