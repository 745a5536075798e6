#pragma once
// `yolo8 export`: state_dict (always), onnx and torchscript (where the build found Debian's libonnx-dev).
#include <map>
#include <string>

#include "trainer/cli/settings.h"

namespace yolo8 {

// keys: the export-only settings taken off the command line (opset, dynamic, imgsz as H or H,W).
int run_export(const Settings& settings, const std::map<std::string, std::string>& keys);

}  // namespace yolo8
