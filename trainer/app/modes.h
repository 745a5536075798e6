#pragma once
// The modes that read datasets or images: train, val, predict and the data tools.
// Needs OpenCV: without it, modes_without_opencv.cpp answers these modes with exit 2.

#include <cstdint>
#include <string>
#include <vector>

#include "models/weights.h"
#include "trainer/app/settings.h"

namespace yolo8 {

int run_train(const Settings& settings);
int run_val(const Settings& settings);
int run_predict(const Settings& settings);
int run_data_check(const Settings& settings);
int run_data_synth(const std::string& out, int train_images, int val_images, int imgsz, uint64_t seed);

}  // namespace yolo8
