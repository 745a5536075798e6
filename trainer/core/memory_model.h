#pragma once
// Linear memory model of a training step, fitted to measured peaks: peak(b) = fixed + per_image·b,
// the per-image part scaling with the pixel count, (imgsz / reference)². Also the memory table
// (configs/memory-table.yaml) that quotad's admission check reads. Needs only yaml-cpp, no LibTorch.

#include <cstdint>
#include <string>
#include <vector>

namespace yolo8 {

constexpr double kBytesPerGib = 1024.0 * 1024.0 * 1024.0;

struct MemorySample {
  int batch = 0;
  int64_t peak_bytes = 0;
};

// Bytes as a function of the batch at the reference image size.
struct LinearMemory {
  double fixed_bytes = 0.0;      // weights, gradients, optimizer state, EMA, workspaces
  double per_image_bytes = 0.0;  // activations and their gradients, per image
  double at(double batch, double imgsz_scale = 1.0) const {
    return fixed_bytes + per_image_bytes * imgsz_scale * batch;
  }
};

// (imgsz / reference_imgsz)²: activations grow with the pixel count.
double imgsz_scale(int imgsz, int reference_imgsz);

// Least squares through the samples with per_image >= 0 (a flat or falling fit keeps the largest
// peak as fixed). A single sample, or samples at one batch, count as all per-image, which
// over-predicts larger batches rather than under-predicting. Throws std::invalid_argument on no
// samples or a batch < 1.
LinearMemory fit_linear_memory(const std::vector<MemorySample>& samples);

struct MemoryFit {
  int reference_imgsz = 640;  // image size the samples were measured at
  LinearMemory train;         // one full training step at batch b
  bool has_validation = false;
  LinearMemory validation;          // one forward-only step, as a function of its own batch
  int validation_batch_factor = 2;  // validation runs at twice the training batch

  double train_peak_bytes(int batch, int imgsz) const;
  // 0 without validation samples.
  double validation_peak_bytes(int batch, int imgsz) const;
  // Peak of a run training at `batch`: max(train(b), validation(factor·b)).
  double predict_peak_bytes(int batch, int imgsz) const;
};

// Validation samples are taken at the validation batch (2b), not at b; they may be empty.
MemoryFit fit_memory(const std::vector<MemorySample>& train_samples,
                     const std::vector<MemorySample>& validation_samples, int reference_imgsz);

// Largest batch in [1, max_batch] whose predicted peak is <= budget_bytes · safety_margin; 0 when
// not even batch 1 fits. Throws std::invalid_argument on a non-positive budget or margin outside (0, 1].
int max_batch_within(const MemoryFit& fit, double budget_bytes, int imgsz, double safety_margin = 0.9,
                     int max_batch = 4096);

// One row of the memory table: a variant's training-step peak at the table's reference imgsz.
struct MemoryTableRow {
  std::string variant;  // yolov8n ...
  double fixed_gib = 0.0;
  double per_image_gib = 0.0;
};

// Where the figures come from; quotad shows it with every admission answer that used the table.
struct MemoryProvenance {
  std::string device;     // "NVIDIA H200", "cpu"
  std::string precision;  // "amp" or "float32"
  std::string libtorch;   // LibTorch version, "2.1.2"
  std::string date;       // YYYY-MM-DD (UTC)
};

// The one memory-table schema, written by `yolo8 profile` and read by quotad (quota/core/policy.cpp):
// source, reference_imgsz, provenance {device, precision, libtorch, date}, models {name: {fixed_gib,
// per_image_gib}}.
struct MemoryTable {
  int reference_imgsz = 640;
  std::string source;  // what measured the figures ("yolo8 profile", "observed", "estimate")
  MemoryProvenance provenance;
  std::vector<MemoryTableRow> variants;  // the rows of `models:`
  // GiB a training process holds on the GPU beyond what its allocator cap covers (the CUDA context, cuBLAS and
  // cuDNN workspaces), measured by `yolo8 profile` on a GPU; < 0 when not measured (then quotad's default applies).
  double process_overhead_gib = -1.0;

  // nullptr when absent.
  const MemoryTableRow* find(const std::string& variant) const;
  // Predicted training peak in GiB of `variant` at (batch, imgsz); throws std::out_of_range naming
  // the variant when it is not in the table.
  double peak_gib(const std::string& variant, int batch, int imgsz) const;
};

// A fit's training part as a table row at `table_reference_imgsz`.
MemoryTableRow to_table_row(const std::string& variant, const MemoryFit& fit, int table_reference_imgsz = 640);

// YAML: reference_imgsz, source, provenance, models: {yolov8n: {fixed_gib: X, per_image_gib: Y}, ...}.
// Write throws std::runtime_error naming the path when it cannot write; read throws
// std::runtime_error naming the file, line and key on bad content.
void write_memory_table(const std::string& path, const MemoryTable& table);
MemoryTable read_memory_table(const std::string& path);

}  // namespace yolo8
