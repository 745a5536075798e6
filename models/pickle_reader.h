#pragma once
// A small Python pickle reader for PyTorch checkpoints: any class reference is kept generically
// (class name + constructor args + BUILD state), tensors are rebuilt from the archive's storages.
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace yolo8::pickle {

enum class Kind {
  kNone,
  kBool,
  kInt,
  kFloat,
  kString,
  kBytes,
  kList,
  kTuple,
  kDict,
  kGlobal,
  kObject,
  kStorage,
  kTensor
};

struct Value;
using ValuePtr = std::shared_ptr<Value>;

struct Value {
  Value() = default;
  Value(const Value&) = delete;
  Value& operator=(const Value&) = delete;
  ~Value();  // iterative: hostile files can nest containers deeper than the stack allows

  Kind kind = Kind::kNone;
  bool b = false;
  int64_t i = 0;
  double f = 0.0;
  std::string s;                                    // String, Bytes; Global/Object: "module.Name"
  std::vector<ValuePtr> items;                      // List, Tuple; Object: constructor args
  std::vector<std::pair<ValuePtr, ValuePtr>> dict;  // Dict, insertion order
  ValuePtr state;                                   // Object: what BUILD set (usually a dict)
  torch::Tensor tensor;                             // Storage (1-D, its dtype) or Tensor

  bool is_none() const { return kind == Kind::kNone; }
  // Dict lookup by string key; nullptr when absent or not a dict.
  const Value* get(const std::string& key) const;
  // Short class name of an Object/Global ("DetectionModel").
  std::string class_name() const;
};

// Returns the storage for a persistent id: key (e.g. "0"), dtype and element count.
using StorageLoader = std::function<torch::Tensor(const std::string& key, c10::ScalarType dtype, int64_t numel)>;

// Parses pickle bytes (protocols 0..5 subset used by torch.save). Throws std::runtime_error on malformed input.
ValuePtr unpickle(const std::string& data, const StorageLoader& load_storage);

// Storage class name ("HalfStorage") to dtype; throws for unknown names.
c10::ScalarType storage_dtype(const std::string& class_name);

}  // namespace yolo8::pickle
