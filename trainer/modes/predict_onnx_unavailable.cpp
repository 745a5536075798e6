// Built where OpenCV's DNN module or libonnx was not found: an ONNX model is refused by name.
#include <stdexcept>

#include "trainer/modes/predict_onnx.h"

namespace yolo8 {

PredictModel open_onnx_predict_model(const std::string& path) {
  throw std::runtime_error(path + ": this yolo8 was built without OpenCV DNN or libonnx, so it cannot run ONNX files " +
                           "(scripts/setup.sh installs libopencv-dev and libonnx-dev); use the .pt weights");
}

}  // namespace yolo8
