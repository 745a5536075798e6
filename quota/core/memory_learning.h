#pragma once
// The memory table learned from real runs: the peaks trainers report in their heartbeats (with model, imgsz,
// batch, AMP, device and LibTorch version), fitted per model, device, precision and LibTorch version to fixed +
// per-image (least squares), written in the one memory-table schema the policy reads. Pure: no I/O.
#include <string>
#include <vector>

namespace yolo8::quota {

struct MemoryObservation {
  std::string model;
  std::string device;  // device name as the trainer reports it ("NVIDIA H200", "cpu")
  bool amp = false;
  int imgsz = 0;
  int batch = 0;  // images per GPU
  double peak_gib = 0;
  std::string libtorch;  // LibTorch version of the trainer; "" when it did not say (older trainers)
};

struct ObservedRow {
  std::string model;
  std::string device;
  bool amp = false;
  double fixed_gib = 0;
  double per_image_gib = 0;  // at imgsz 640
  int samples = 0;
  std::string libtorch;
};

// Least squares of peak = fixed + per_image * batch * (imgsz/640)^2 per (model, device, AMP, LibTorch), with
// per_image > 0 and fixed >= 0: a flat or falling fit, or samples at one size, puts everything into
// per-image (over-predicting larger batches rather than under-predicting). Rows ordered by device, model, AMP,
// LibTorch version (an upgrade may change the allocator's and the kernels' memory, so versions are not mixed).
std::vector<ObservedRow> fit_observed(const std::vector<MemoryObservation>& observations);

// The memory-table YAML (source, reference_imgsz, provenance, models) of the rows for one device, precision and
// LibTorch version (named in the provenance unless the observations did not say it); `date` is YYYY-MM-DD.
// `process_overhead_gib` (>= 0) is written as the table's process_overhead_gib: heartbeats' peaks say nothing of
// it, so it is carried from the table `yolo8 profile` measured; < 0 leaves the key out.
// Throws std::invalid_argument when `rows` mix devices, precisions or LibTorch versions.
std::string observed_table_yaml(const std::vector<ObservedRow>& rows, const std::string& date,
                                double process_overhead_gib = -1);

}  // namespace yolo8::quota
