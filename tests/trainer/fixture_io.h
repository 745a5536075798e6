#pragma once
// Reads the torch.save() golden files and walks their IValue trees.
#include <torch/torch.h>

#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "test_paths.h"

namespace yolo8::test {

inline c10::IValue load_fixture(const std::string& name) {
  const std::string path = std::string(kFixturesDir) + "/" + name;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open fixture " + path);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return torch::pickle_load(bytes);
}

inline c10::IValue at(const c10::IValue& dict, const std::string& key) {
  auto d = dict.toGenericDict();
  auto it = d.find(key);
  if (it == d.end()) throw std::runtime_error("fixture key missing: " + key);
  return it->value();
}

inline std::vector<c10::IValue> as_list(const c10::IValue& v) {
  std::vector<c10::IValue> out;
  if (v.isList()) {
    for (const auto& e : v.toList()) out.push_back(e);
  } else if (v.isTuple()) {
    for (const auto& e : v.toTupleRef().elements()) out.push_back(e);
  } else {
    throw std::runtime_error("fixture value is not a list");
  }
  return out;
}

inline std::vector<torch::Tensor> as_tensors(const c10::IValue& v) {
  std::vector<torch::Tensor> out;
  for (const auto& e : as_list(v)) out.push_back(e.toTensor());
  return out;
}

inline double as_double(const c10::IValue& v) {
  if (v.isDouble()) return v.toDouble();
  if (v.isInt()) return static_cast<double>(v.toInt());
  if (v.isTensor()) return v.toTensor().item<double>();
  throw std::runtime_error("fixture value is not a number");
}

}  // namespace yolo8::test
