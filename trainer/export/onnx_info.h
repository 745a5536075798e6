#pragma once
// What running an exported detector needs to know about it: the input size from its graph, and names and stride
// from the metadata Ultralytics (and our exporter) write. Reads files from either tool.
#include <cstdint>
#include <string>
#include <vector>

namespace yolo8 {

struct OnnxModelInfo {
  int64_t height = 0;  // the input's fixed size; 0 when the graph leaves it dynamic
  int64_t width = 0;
  int64_t stride = 32;             // metadata `stride`; 32 when absent
  std::vector<std::string> names;  // metadata `names` in id order; empty when absent
  std::string input_name;          // "images"
  std::string output_name;         // "output0"
};

// Throws std::runtime_error naming the file (and the metadata key) when it is not an ONNX model or a value
// does not parse.
OnnxModelInfo read_onnx_info(const std::string& path);

// Parses Python's str() of a dict of int to str ({0: 'person', 1: "it's"}) into names in id order; the ids must
// be 0..n-1. Throws std::invalid_argument saying where it stopped.
std::vector<std::string> parse_python_names_dict(const std::string& text);

}  // namespace yolo8
