#pragma once
// Reading the reference cases written by torch.save (plain tensors, lists, dicts).
#include <torch/torch.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "test_paths.h"

namespace yolo8::test {

inline std::string fixture(const std::string& name) { return std::string(kFixturesDir) + "/" + name; }

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline c10::IValue load_case(const std::string& name) {
  const std::string bytes = read_bytes(fixture(name));
  return torch::pickle_load(std::vector<char>(bytes.begin(), bytes.end()));
}

inline c10::IValue dict_get(const c10::IValue& d, const std::string& key) { return d.toGenericDict().at(key); }

inline std::vector<torch::Tensor> tensor_list(const c10::IValue& v) {
  std::vector<torch::Tensor> out;
  if (v.isTensorList()) {
    for (const auto& t : v.toTensorList()) out.push_back(t);
  } else if (v.isList()) {
    for (const auto& t : v.toListRef()) out.push_back(t.toTensor());
  } else {
    for (const auto& t : v.toTupleRef().elements()) out.push_back(t.toTensor());
  }
  return out;
}

inline double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
}

}  // namespace yolo8::test
