#pragma once
// Knobs of the data pipeline: plain structs with Ultralytics' names and defaults. No OpenCV and no LibTorch
// (library yolo_data_config), so the settings can hold them on a machine built without OpenCV.
#include <cstdint>
#include <string>

namespace yolo8::data {

enum class CacheMode { kNone, kRam, kDisk };

// Parses "none" / "false" / "" / "ram" / "true" / "disk"; throws naming the key on anything else.
CacheMode parse_cache_mode(const std::string& value);
std::string to_string(CacheMode mode);

struct AugmentConfig {
  double hsv_h = 0.015;      // hue gain (fraction)
  double hsv_s = 0.7;        // saturation gain (fraction)
  double hsv_v = 0.4;        // value gain (fraction)
  double degrees = 0.0;      // rotation range (+/- deg)
  double translate = 0.1;    // translation (+/- fraction)
  double scale = 0.5;        // scale gain (+/- fraction)
  double shear = 0.0;        // shear (+/- deg)
  double perspective = 0.0;  // perspective (+/- fraction), 0 keeps the warp affine
  double flipud = 0.0;       // probability of an up-down flip
  double fliplr = 0.5;       // probability of a left-right flip
  double mosaic = 1.0;       // probability of a 4-image mosaic
  double mixup = 0.0;        // probability of mixup
  int close_mosaic = 10;     // mosaic off for the last N epochs
};

// The fields the command line sets (imgsz, workers, cache, rect, single_cls, fraction, seed) live in yolo8's
// Settings as one LoaderConfig; a loader copies it and fills in the rest.
struct LoaderConfig {
  int imgsz = 640;
  int batch = 16;
  int workers = 8;  // clamped to the hardware threads
  CacheMode cache = CacheMode::kNone;
  bool rect = false;  // rectangular batches (the trainer's validation loader always sets it)
  bool single_cls = false;
  double fraction = 1.0;  // fraction of the training images used
  uint64_t seed = 0;
  int stride = 32;      // model's largest stride, for rectangular batch shapes
  int prefetch = 4;     // batches buffered ahead of the consumer
  bool shuffle = true;  // only for training loaders
  int rank = 0;         // data-parallel training: this process's share of every epoch
  int world_size = 1;
  // Page-locked batches, which copy to a GPU asynchronously: only for a loader that feeds one (pinning creates a
  // CUDA context, and on a GPU node a CPU-only run must not take one on a GPU leased to someone else).
  bool pin_memory = false;
};

// Throws std::invalid_argument naming the first bad key.
void validate(const AugmentConfig& cfg);
void validate(const LoaderConfig& cfg);

}  // namespace yolo8::data
