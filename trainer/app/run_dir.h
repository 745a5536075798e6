#pragma once
// Run folders (`runs/train/NAME`, incremented unless exist_ok) and the results.csv every run writes.

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace yolo8 {

// project/mode/name, or name2, name3 ... when it exists and !exist_ok; created with weights/.
std::filesystem::path make_run_dir(const std::string& project, const std::string& mode, const std::string& name,
                                   bool exist_ok);

// The most recently written */weights/last.pt under project/mode, or "" if none.
std::filesystem::path latest_last_checkpoint(const std::string& project, const std::string& mode);

// Appends one row per epoch; writes the header when the file is new. Flushed per row so a crash keeps it.
class ResultsCsv {
 public:
  explicit ResultsCsv(const std::filesystem::path& path);
  static const std::vector<std::string>& columns();
  void append(const std::vector<double>& values);  // in columns() order
  // Keeps only rows of epochs 1..last_epoch (a resumed run rewrites the epochs it repeats).
  void keep_epochs_up_to(int last_epoch);

 private:
  std::filesystem::path path_;
};

}  // namespace yolo8
