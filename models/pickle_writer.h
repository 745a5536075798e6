#pragma once
// The counterpart of pickle_reader: writes protocol-2 pickles as torch.save lays them out (tensors through
// torch._utils._rebuild_tensor_v2 over persistent-id storages), and the torch zip archive around them, so Python's
// torch.load (and torch::pickle_load, for plain values) reads what LibTorch code writes. Class references are
// written as GLOBAL + REDUCE/BUILD calls: the reader builds those objects itself.
#include <torch/torch.h>
#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace yolo8::pickle {

class Writer {
 public:
  using MemoId = uint32_t;

  Writer();

  void none();
  void boolean(bool b);
  void integer(int64_t i);
  void real(double f);
  void string(const std::string& s);  // UTF-8 text (Python str)
  void global(const std::string& module, const std::string& name);
  void tensor(const torch::Tensor& t);  // its whole storage is stored once, shared by every view of it

  void mark();
  void tuple();          // MARK ... -> tuple
  void tuple(size_t n);  // the top n values (0..3) -> tuple
  void empty_dict();
  void set_items();  // MARK k v k v ... onto the dict below the MARK
  void set_item();   // dict k v -> dict
  void empty_list();
  void appends();  // MARK v v ... onto the list below the MARK
  void reduce();   // callable args -> callable(*args)
  void build();    // object state -> object with state applied (__setstate__ or __dict__ update)
  void pop();
  MemoId memoize();  // remembers the top value (it stays on the stack)
  void get(MemoId id);

  // STOP; the pickle bytes. The writer is spent afterwards.
  std::string finish();
  // (record key, 1-D storage tensor) in first-use order: what save_archive writes under data/.
  const std::vector<std::pair<std::string, torch::Tensor>>& storages() const { return storages_; }

 private:
  void op(uint8_t code) { out_.push_back(static_cast<char>(code)); }
  void u32(uint32_t v);

  std::string out_;
  MemoId next_memo_ = 0;
  std::vector<std::pair<std::string, torch::Tensor>> storages_;
  std::vector<const void*> storage_ids_;  // StorageImpl of storages_[k]
};

// Python values for LibTorch ones: None, bool, int, float, str, Tensor, dicts with string or int keys, lists and
// tuples of those. Throws std::invalid_argument for anything else.
void write_ivalue(Writer& w, const c10::IValue& value);

// A YAML document as PyYAML's safe_load gives it: mappings -> dict, sequences -> list, plain scalars resolved as
// YAML 1.1 (null/~ -> None, true/false/yes/no/on/off -> bool, integers, floats), quoted scalars -> str.
void write_yaml(Writer& w, const YAML::Node& node);

// The torch.save zip: data.pkl, byteorder, data/<key> per storage, version (PyTorchStreamWriter).
std::vector<char> save_archive(const std::string& pickle_bytes,
                               const std::vector<std::pair<std::string, torch::Tensor>>& storages);

}  // namespace yolo8::pickle
