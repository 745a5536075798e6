#pragma once
// Deterministic synthetic detection dataset: shapes and surface defects on textured backgrounds.
#include <cstdint>
#include <string>
#include <vector>

namespace yolo8::data {

struct SynthResult {
  std::string yaml_path;  // <out_dir>/data.yaml
  int64_t train_images = 0, val_images = 0;
  int64_t train_instances = 0, val_instances = 0;
  std::vector<std::string> names;
};

// Classes: circle, rectangle, triangle, scratch, stain. Writes <out>/images/{train,val}/*.jpg,
// <out>/labels/{train,val}/*.txt and <out>/data.yaml. Same arguments give the same files.
// `yolo8 data synth out=DIR train=N val=M imgsz=S seed=K`.
SynthResult synthesize_dataset(const std::string& out_dir, int n_train, int n_val, int imgsz, uint64_t seed);

const std::vector<std::string>& synth_class_names();

}  // namespace yolo8::data
