#pragma once
// The modes that read datasets or images: train, val, predict and the data tools.
// Built only with OpenCV (YOLO8_HAVE_DATA); a bare GPU build keeps the OpenCV-free core (train_step, profiler).

#include <string>
#include <vector>

#include "models/weights.h"
#include "trainer/settings.h"

namespace yolo8 {

// A problem with the user's data or weights: main() exits 2, retrying will not help.
class DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Model weights from a yolo8 checkpoint (last.pt / best.pt: the EMA weights), an Ultralytics `.pt`, a
// state-dict file or a model YAML (fresh weights).
LoadedModel load_any_model(const std::string& spec, int64_t nc_override = 0);

// True when `path` is a checkpoint written by yolo8's trainer.
bool is_training_checkpoint(const std::string& path);

// The checkpoint a `resume` setting points at ("" when the run starts fresh); throws when resume=true or a
// path finds nothing resumable.
std::string resolve_resume_checkpoint(const Settings& settings);

int run_train(const Settings& settings);
int run_val(const Settings& settings);
int run_predict(const Settings& settings);
int run_data_check(const Settings& settings);
int run_data_synth(const std::string& out, int train_images, int val_images, int imgsz, int seed);

}  // namespace yolo8
