#include "models/pickle_writer.h"

#include <caffe2/serialize/inline_container.h>

#include <cstring>
#include <regex>
#include <stdexcept>

namespace yolo8::pickle {

namespace {

// Python's storage class per dtype (what torch.save names in the persistent id).
std::string storage_class(c10::ScalarType dtype) {
  switch (dtype) {
    case torch::kHalf: return "HalfStorage";
    case torch::kFloat: return "FloatStorage";
    case torch::kDouble: return "DoubleStorage";
    case torch::kLong: return "LongStorage";
    case torch::kInt: return "IntStorage";
    case torch::kShort: return "ShortStorage";
    case torch::kChar: return "CharStorage";
    case torch::kByte: return "ByteStorage";
    case torch::kBool: return "BoolStorage";
    case torch::kBFloat16: return "BFloat16Storage";
    default: throw std::invalid_argument(std::string("pickle writer: no storage class for ") + c10::toString(dtype));
  }
}

}  // namespace

Writer::Writer() {
  op(0x80);  // PROTO 2, as torch.save writes
  op(2);
}

void Writer::u32(uint32_t v) {
  for (int k = 0; k < 4; ++k) out_.push_back(static_cast<char>((v >> (8 * k)) & 0xff));
}

void Writer::none() { op('N'); }
void Writer::boolean(bool b) { op(b ? 0x88 : 0x89); }

void Writer::integer(int64_t i) {
  if (i >= 0 && i < 256) {
    op('K');  // BININT1
    op(static_cast<uint8_t>(i));
  } else if (i >= 0 && i < 65536) {
    op('M');  // BININT2
    op(static_cast<uint8_t>(i & 0xff));
    op(static_cast<uint8_t>(i >> 8));
  } else if (i >= INT32_MIN && i <= INT32_MAX) {
    op('J');  // BININT, signed 32-bit
    u32(static_cast<uint32_t>(static_cast<int32_t>(i)));
  } else {
    op(0x8a);  // LONG1: 8 bytes of two's complement, little-endian
    op(8);
    const auto u = static_cast<uint64_t>(i);
    for (int k = 0; k < 8; ++k) op(static_cast<uint8_t>((u >> (8 * k)) & 0xff));
  }
}

void Writer::real(double f) {
  op('G');  // BINFLOAT, big-endian: bitwise, so a resumed run gets the same doubles
  uint64_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  for (int k = 7; k >= 0; --k) op(static_cast<uint8_t>((bits >> (8 * k)) & 0xff));
}

void Writer::string(const std::string& s) {
  if (s.size() > UINT32_MAX) throw std::invalid_argument("pickle writer: string too long");
  op('X');  // BINUNICODE
  u32(static_cast<uint32_t>(s.size()));
  out_ += s;
}

void Writer::global(const std::string& module, const std::string& name) {
  if (module.find('\n') != std::string::npos || name.find('\n') != std::string::npos) {
    throw std::invalid_argument("pickle writer: a global name holds a newline");
  }
  op('c');
  out_ += module + "\n" + name + "\n";
}

void Writer::tensor(const torch::Tensor& t) {
  if (!t.defined()) throw std::invalid_argument("pickle writer: undefined tensor");
  const torch::Tensor cpu = t.device().is_cpu() ? t.detach() : t.detach().cpu();
  const c10::ScalarType dtype = cpu.scalar_type();
  const size_t item = c10::elementSize(dtype);
  const void* id = cpu.storage().unsafeGetStorageImpl();
  std::string key;
  for (size_t k = 0; k < storage_ids_.size(); ++k) {
    if (storage_ids_[k] == id) key = storages_[k].first;
  }
  const auto numel = static_cast<int64_t>(cpu.storage().nbytes() / item);
  if (key.empty()) {
    key = std::to_string(storages_.size());
    // The storage as a 1-D tensor of its dtype; it keeps the StorageImpl (and so its id) alive.
    storages_.emplace_back(key, torch::empty({0}, cpu.options()).set_(cpu.storage(), 0, {numel}, {1}));
    storage_ids_.push_back(id);
  }
  global("torch._utils", "_rebuild_tensor_v2");
  mark();
  {
    mark();  // persistent id: ('storage', torch.FloatStorage, key, 'cpu', numel)
    string("storage");
    global("torch", storage_class(dtype));
    string(key);
    string("cpu");
    integer(numel);
    tuple();
    op('Q');  // BINPERSID
  }
  integer(cpu.storage_offset());
  mark();
  for (const int64_t s : cpu.sizes()) integer(s);
  tuple();
  mark();
  for (const int64_t s : cpu.strides()) integer(s);
  tuple();
  boolean(false);                        // requires_grad
  global("collections", "OrderedDict");  // backward hooks: none
  tuple(0);
  reduce();
  tuple();
  reduce();
}

void Writer::mark() { op('('); }
void Writer::tuple() { op('t'); }
void Writer::tuple(size_t n) {
  static const uint8_t kOps[] = {')', 0x85, 0x86, 0x87};
  if (n > 3) throw std::invalid_argument("pickle writer: tuple(n) takes at most 3 values; use mark() and tuple()");
  op(kOps[n]);
}
void Writer::empty_dict() { op('}'); }
void Writer::set_items() { op('u'); }
void Writer::set_item() { op('s'); }
void Writer::empty_list() { op(']'); }
void Writer::appends() { op('e'); }
void Writer::reduce() { op('R'); }
void Writer::build() { op('b'); }
void Writer::pop() { op('0'); }

Writer::MemoId Writer::memoize() {
  const MemoId id = next_memo_++;
  op('r');  // LONG_BINPUT
  u32(id);
  return id;
}

void Writer::get(MemoId id) {
  if (id >= next_memo_) throw std::invalid_argument("pickle writer: memo id never stored");
  op('j');  // LONG_BINGET
  u32(id);
}

std::string Writer::finish() {
  op('.');
  return std::move(out_);
}

void write_ivalue(Writer& w, const c10::IValue& v) {
  if (v.isNone()) {
    w.none();
  } else if (v.isBool()) {
    w.boolean(v.toBool());
  } else if (v.isInt()) {
    w.integer(v.toInt());
  } else if (v.isDouble()) {
    w.real(v.toDouble());
  } else if (v.isString()) {
    w.string(v.toStringRef());
  } else if (v.isTensor()) {
    w.tensor(v.toTensor());
  } else if (v.isGenericDict()) {
    w.empty_dict();
    const auto dict = v.toGenericDict();
    if (dict.size() == 0) return;
    w.mark();
    for (const auto& e : dict) {
      if (!e.key().isString() && !e.key().isInt()) throw std::invalid_argument("pickle writer: dict key not str/int");
      write_ivalue(w, e.key());
      write_ivalue(w, e.value());
    }
    w.set_items();
  } else if (v.isList()) {
    w.empty_list();
    const auto& items = v.toListRef();
    if (items.empty()) return;
    w.mark();
    for (const auto& item : items) write_ivalue(w, item);
    w.appends();
  } else if (v.isTuple()) {
    w.mark();
    for (const auto& item : v.toTupleRef().elements()) write_ivalue(w, item);
    w.tuple();
  } else {
    throw std::invalid_argument("pickle writer: cannot write a " + v.tagKind());
  }
}

void write_yaml(Writer& w, const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Undefined:
    case YAML::NodeType::Null: w.none(); return;
    case YAML::NodeType::Sequence:
      w.empty_list();
      if (node.size() == 0) return;
      w.mark();
      for (const auto& item : node) write_yaml(w, item);
      w.appends();
      return;
    case YAML::NodeType::Map:
      w.empty_dict();
      if (node.size() == 0) return;
      w.mark();
      for (const auto& item : node) {
        write_yaml(w, item.first);
        write_yaml(w, item.second);
      }
      w.set_items();
      return;
    case YAML::NodeType::Scalar: break;
  }
  const std::string& s = node.Scalar();
  if (node.Tag() != "?") {  // quoted ("!") or explicitly tagged: PyYAML keeps the text
    w.string(s);
    return;
  }
  // PyYAML's implicit resolvers (YAML 1.1) for the forms a config holds.
  static const std::regex kNull("~|null|Null|NULL|");
  static const std::regex kTrue("yes|Yes|YES|true|True|TRUE|on|On|ON");
  static const std::regex kFalse("no|No|NO|false|False|FALSE|off|Off|OFF");
  static const std::regex kInt("[-+]?(0|[1-9][0-9_]*)");
  static const std::regex kFloat(
      "[-+]?([0-9][0-9_]*)?\\.[0-9_]*([eE][-+][0-9]+)?|\\.(inf|Inf|INF)|[-+]\\.(inf|Inf|INF)|\\.(nan|NaN|NAN)");
  if (std::regex_match(s, kNull)) {
    w.none();
  } else if (std::regex_match(s, kTrue)) {
    w.boolean(true);
  } else if (std::regex_match(s, kFalse)) {
    w.boolean(false);
  } else if (std::regex_match(s, kInt)) {
    std::string digits;
    for (const char c : s) {
      if (c != '_' && c != '+') digits += c;
    }
    try {
      w.integer(std::stoll(digits));
    } catch (const std::out_of_range&) {
      w.string(s);  // wider than 64 bits: not in any config we write
    }
  } else if (std::regex_match(s, kFloat) && s != "." && s != "-." && s != "+.") {
    std::string text;
    for (const char c : s) {
      if (c != '_') text += c;
    }
    w.real(std::strtod(text.c_str(), nullptr));  // strtod reads inf and nan in any case
  } else {
    w.string(s);
  }
}

// A zip record's headers, its name and its padding to the 64-byte alignment take less than this.
constexpr size_t kArchiveOverheadPerRecord = 512;

std::vector<char> save_archive(const std::string& pickle_bytes,
                               const std::vector<std::pair<std::string, torch::Tensor>>& storages) {
  // Reserved once: growing a checkpoint-sized buffer step by step copied it about once more, into fresh pages.
  size_t bound = pickle_bytes.size() + kArchiveOverheadPerRecord * (storages.size() + 8);
  for (const auto& entry : storages) bound += entry.second.nbytes();
  std::vector<char> out;
  out.reserve(bound);
  caffe2::serialize::PyTorchStreamWriter writer([&out](const void* data, size_t n) -> size_t {
    const char* p = static_cast<const char*>(data);
    out.insert(out.end(), p, p + n);
    return n;
  });
  writer.writeRecord("data.pkl", pickle_bytes.data(), pickle_bytes.size());
  writer.writeRecord(".format_version", "1", 1);  // storages in numeric key order, as torch.save writes them
  writer.writeRecord(".storage_alignment", "64", 2);
  writer.writeRecord("byteorder", "little", 6);
  for (const auto& [key, storage] : storages) {
    writer.writeRecord("data/" + key, storage.data_ptr(), storage.nbytes());
  }
  writer.writeEndOfFile();
  return out;
}

}  // namespace yolo8::pickle
