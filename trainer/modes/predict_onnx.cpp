#include "trainer/modes/predict_onnx.h"

#include <opencv2/dnn.hpp>

#include <stdexcept>

#include "trainer/export/onnx_info.h"

namespace yolo8 {

PredictModel open_onnx_predict_model(const std::string& path) {
  const OnnxModelInfo info = read_onnx_info(path);
  cv::dnn::Net net;
  try {
    net = cv::dnn::readNetFromONNX(path);
  } catch (const cv::Exception& error) {
    throw std::runtime_error(path + ": OpenCV DNN " + CV_VERSION + " cannot load it: " + error.what());
  }
  if (net.empty()) throw std::runtime_error(path + ": OpenCV DNN " + CV_VERSION + " loaded an empty network");
  PredictModel model;
  model.names = info.names;
  model.stride = static_cast<int>(info.stride);
  model.fixed_height = static_cast<int>(info.height);
  model.fixed_width = static_cast<int>(info.width);
  model.description = path + " through OpenCV DNN " + CV_VERSION + " on the CPU" +
                      (info.height > 0 ? ", input " + std::to_string(info.height) + "x" + std::to_string(info.width) +
                                             " fixed by the graph"
                                       : std::string());
  const size_t expected_rows = info.names.empty() ? 0 : 4 + info.names.size();
  model.forward = [net, info, expected_rows, path](const torch::Tensor& input) mutable {
    torch::Tensor contiguous = input.to(torch::kCPU, torch::kFloat).contiguous();
    const int dims[] = {1, 3, static_cast<int>(contiguous.size(2)), static_cast<int>(contiguous.size(3))};
    const cv::Mat blob(4, dims, CV_32F, contiguous.data_ptr<float>());
    net.setInput(blob, info.input_name);
    const cv::Mat out = net.forward(info.output_name);
    if (out.dims != 3 || out.size[0] != 1 || out.size[1] < 5 ||
        (expected_rows > 0 && static_cast<size_t>(out.size[1]) != expected_rows)) {
      throw std::runtime_error(path + ": output '" + info.output_name +
                               "' is not 1×(4+nc)×anchors for the nc its names give");
    }
    return torch::from_blob(const_cast<float*>(out.ptr<float>()), {1, out.size[1], out.size[2]}, torch::kFloat).clone();
  };
  return model;
}

}  // namespace yolo8
