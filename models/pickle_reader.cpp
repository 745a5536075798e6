#include "models/pickle_reader.h"

#include <cstring>
#include <limits>
#include <stdexcept>
#include <unordered_map>

namespace yolo8::pickle {

namespace {

constexpr size_t kMaxMemo = 1u << 24;  // memo entries a sane checkpoint never exceeds
constexpr int64_t kMaxTensorNumel = int64_t{1} << 34;

ValuePtr make(Kind k) {
  auto v = std::make_shared<Value>();
  v->kind = k;
  return v;
}

ValuePtr make_int(int64_t i) {
  auto v = make(Kind::kInt);
  v->i = i;
  return v;
}

ValuePtr make_str(Kind k, std::string s) {
  auto v = make(k);
  v->s = std::move(s);
  return v;
}

class Unpickler {
 public:
  Unpickler(const std::string& data, const StorageLoader& loader) : d_(data), loader_(loader) {}

  ValuePtr run() {
    while (true) {
      const uint8_t op = u8();
      switch (op) {
        case 0x80: u8(); break;                            // PROTO
        case 0x95: take(8); break;                         // FRAME
        case '}': push(make(Kind::kDict)); break;          // EMPTY_DICT
        case ']': push(make(Kind::kList)); break;          // EMPTY_LIST
        case ')': push(make(Kind::kTuple)); break;         // EMPTY_TUPLE
        case 0x8f: push(make(Kind::kList)); break;         // EMPTY_SET
        case '(': marks_.push_back(stack_.size()); break;  // MARK
        case 'q': memo_put(u8()); break;                   // BINPUT
        case 'r': memo_put(u32()); break;                  // LONG_BINPUT
        case 0x94: memo_put(memo_.size()); break;          // MEMOIZE
        case 'h': push(memo_get(u8())); break;             // BINGET
        case 'j': push(memo_get(u32())); break;            // LONG_BINGET
        case 'X': push(make_str(Kind::kString, take(u32()))); break;
        case 0x8c: push(make_str(Kind::kString, take(u8()))); break;
        case 0x8d: push(make_str(Kind::kString, take(u64()))); break;
        case 'T': push(make_str(Kind::kString, take(u32()))); break;
        case 'U': push(make_str(Kind::kString, take(u8()))); break;
        case 'B': push(make_str(Kind::kBytes, take(u32()))); break;
        case 'C': push(make_str(Kind::kBytes, take(u8()))); break;
        case 0x8e: push(make_str(Kind::kBytes, take(u64()))); break;
        case 'J': push(make_int(static_cast<int32_t>(u32()))); break;
        case 'K': push(make_int(u8())); break;
        case 'M': push(make_int(u16())); break;
        case 0x8a: push(make_int(long_bytes(u8()))); break;   // LONG1
        case 0x8b: push(make_int(long_bytes(u32()))); break;  // LONG4
        case 'G': {
          uint64_t bits = 0;
          for (int k = 0; k < 8; ++k) bits = (bits << 8) | u8();  // big-endian
          auto v = make(Kind::kFloat);
          std::memcpy(&v->f, &bits, sizeof(double));
          push(v);
          break;
        }
        case 'I': push(text_int(line())); break;
        case 'L': push(text_int(line())); break;
        case 'F': {
          auto v = make(Kind::kFloat);
          v->f = std::strtod(line().c_str(), nullptr);
          push(v);
          break;
        }
        case 'N': push(make(Kind::kNone)); break;
        case 0x88: push_bool(true); break;
        case 0x89: push_bool(false); break;
        case 'c': {
          std::string module = line();
          std::string name = line();
          push(make_str(Kind::kGlobal, module + "." + name));
          break;
        }
        case 0x93: {  // STACK_GLOBAL
          auto name = pop(), module = pop();
          push(make_str(Kind::kGlobal, module->s + "." + name->s));
          break;
        }
        case 0x81: {  // NEWOBJ
          auto args = pop(), cls = pop();
          push(object(cls, args));
          break;
        }
        case 0x92: {  // NEWOBJ_EX
          pop();
          auto args = pop(), cls = pop();
          push(object(cls, args));
          break;
        }
        case 'R': {
          auto args = pop(), fn = pop();
          push(reduce(fn, args));
          break;
        }
        case 'b': {
          auto state = pop();
          auto& obj = top();
          if (obj->kind == Kind::kObject)
            obj->state = state;
          else if (obj->kind == Kind::kDict && state->kind == Kind::kDict) {
            for (auto& kv : state->dict) obj->dict.push_back(kv);
          }
          break;
        }
        case 's': {
          auto v = pop(), k = pop();
          set_item(top(), k, v);
          break;
        }
        case 'u': {
          auto items = pop_mark();
          if (items.size() % 2 != 0) fail("SETITEMS with an odd item count");
          auto& d = top();
          for (size_t k = 0; k < items.size(); k += 2) set_item(d, items[k], items[k + 1]);
          break;
        }
        case 'a': {
          auto v = pop();
          append(top(), v);
          break;
        }
        case 'e':
        case 0x90: {  // APPENDS, ADDITEMS
          auto items = pop_mark();
          auto& l = top();
          for (auto& v : items) append(l, v);
          break;
        }
        case 0x91: {  // FROZENSET
          auto v = make(Kind::kList);
          v->items = pop_mark();
          push(v);
          break;
        }
        case 't': {
          auto v = make(Kind::kTuple);
          v->items = pop_mark();
          push(v);
          break;
        }
        case 0x85:
        case 0x86:
        case 0x87: {
          const size_t n = op - 0x84u;
          auto v = make(Kind::kTuple);
          v->items.resize(n);
          for (size_t k = n; k-- > 0;) v->items[k] = pop();
          push(v);
          break;
        }
        case 'Q': {
          auto pid = pop();
          push(persistent(pid));
          break;
        }
        case '0': pop(); break;
        case '1': pop_mark(); break;
        case '2': push(top()); break;
        case '.': {
          if (stack_.size() != 1) fail("STOP with " + std::to_string(stack_.size()) + " values on the stack");
          return stack_.back();
        }
        default: fail("unsupported opcode 0x" + hex(op));
      }
    }
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("pickle: " + what + " at byte " + std::to_string(pos_));
  }
  static std::string hex(uint8_t b) {
    const char* digits = "0123456789abcdef";
    return {digits[b >> 4], digits[b & 15]};
  }

  uint8_t u8() {
    if (pos_ >= d_.size()) fail("unexpected end of data");
    return static_cast<uint8_t>(d_[pos_++]);
  }
  uint32_t u16() { return u8() | (static_cast<uint32_t>(u8()) << 8); }
  uint32_t u32() {
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) v |= static_cast<uint32_t>(u8()) << (8 * k);
    return v;
  }
  uint64_t u64() {
    uint64_t v = 0;
    for (int k = 0; k < 8; ++k) v |= static_cast<uint64_t>(u8()) << (8 * k);
    return v;
  }
  std::string take(uint64_t n) {
    if (n > d_.size() - pos_) fail("length " + std::to_string(n) + " runs past the end");
    std::string s = d_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  std::string line() {
    const size_t end = d_.find('\n', pos_);
    if (end == std::string::npos) fail("unterminated line");
    std::string s = d_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return s;
  }
  int64_t long_bytes(uint64_t n) {
    if (n > 8) fail("integer wider than 64 bits");
    const std::string b = take(n);
    uint64_t v = 0;
    for (size_t k = 0; k < n; ++k) v |= static_cast<uint64_t>(static_cast<uint8_t>(b[k])) << (8 * k);
    if (n > 0 && n < 8 && (static_cast<uint8_t>(b[n - 1]) & 0x80)) v |= ~uint64_t{0} << (8 * n);  // sign-extend
    return static_cast<int64_t>(v);
  }
  ValuePtr text_int(std::string s) {
    if (!s.empty() && s.back() == 'L') s.pop_back();
    if (s == "00") return make_bool(false);
    if (s == "01") return make_bool(true);
    char* end = nullptr;
    const long long v = std::strtoll(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0') fail("bad integer text");
    return make_int(v);
  }
  static ValuePtr make_bool(bool b) {
    auto v = make(Kind::kBool);
    v->b = b;
    return v;
  }
  void push_bool(bool b) { push(make_bool(b)); }

  void push(ValuePtr v) { stack_.push_back(std::move(v)); }
  ValuePtr pop() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back())) fail("stack underflow");
    auto v = std::move(stack_.back());
    stack_.pop_back();
    return v;
  }
  ValuePtr& top() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back())) fail("stack underflow");
    return stack_.back();
  }
  std::vector<ValuePtr> pop_mark() {
    if (marks_.empty()) fail("no MARK");
    const size_t m = marks_.back();
    marks_.pop_back();
    if (m > stack_.size()) fail("corrupt MARK");
    std::vector<ValuePtr> items(std::make_move_iterator(stack_.begin() + static_cast<std::ptrdiff_t>(m)),
                                std::make_move_iterator(stack_.end()));
    stack_.resize(m);
    return items;
  }
  void memo_put(size_t idx) {
    if (idx >= kMaxMemo) fail("memo index too large");
    memo_[idx] = top();
  }
  ValuePtr memo_get(size_t idx) {
    auto it = memo_.find(idx);
    if (it == memo_.end()) fail("memo index " + std::to_string(idx) + " never stored");
    return it->second;
  }

  void set_item(const ValuePtr& d, const ValuePtr& k, const ValuePtr& v) {
    if (d->kind != Kind::kDict) fail("SETITEM on a non-dict");
    d->dict.emplace_back(k, v);
  }
  void append(const ValuePtr& l, const ValuePtr& v) {
    if (l->kind == Kind::kList || l->kind == Kind::kTuple)
      l->items.push_back(v);
    else if (l->kind == Kind::kObject)
      l->items.push_back(v);  // list subclasses
    else
      fail("APPEND on a non-list");
  }

  ValuePtr object(const ValuePtr& cls, const ValuePtr& args) {
    auto o = make(Kind::kObject);
    o->s = cls->kind == Kind::kGlobal ? cls->s : std::string("?");
    if (args->kind == Kind::kTuple || args->kind == Kind::kList) o->items = args->items;
    return o;
  }

  const std::vector<ValuePtr>& tuple_items(const ValuePtr& v, const char* what) {
    if (v->kind != Kind::kTuple && v->kind != Kind::kList) fail(std::string(what) + " expects a tuple");
    return v->items;
  }
  int64_t int_of(const ValuePtr& v, const char* what) {
    if (v->kind == Kind::kInt) return v->i;
    if (v->kind == Kind::kBool) return v->b ? 1 : 0;
    fail(std::string(what) + " expects an integer");
  }

  ValuePtr reduce(const ValuePtr& fn, const ValuePtr& args) {
    const std::string name = fn->kind == Kind::kGlobal ? fn->s : std::string();
    if (name == "collections.OrderedDict" || name == "builtins.dict" || name == "__builtin__.dict") {
      return make(Kind::kDict);
    }
    if (name == "torch._utils._rebuild_tensor_v2" || name == "torch._utils._rebuild_tensor") {
      return rebuild_tensor(tuple_items(args, "_rebuild_tensor"));
    }
    if (name == "torch.jit._pickle.restore_type_tag") {  // LibTorch's typed containers: (value, "Dict[str, Tensor]")
      const auto& a = tuple_items(args, "restore_type_tag");
      if (a.empty()) fail("restore_type_tag without a value");
      return a[0];
    }
    if (name == "torch._utils._rebuild_parameter" || name == "torch._utils._rebuild_parameter_with_state") {
      const auto& a = tuple_items(args, "_rebuild_parameter");
      if (a.empty() || a[0]->kind != Kind::kTensor) fail("_rebuild_parameter without a tensor");
      return a[0];
    }
    if (name == "builtins.set" || name == "__builtin__.set" || name == "builtins.frozenset" ||
        name == "__builtin__.frozenset") {
      auto v = make(Kind::kList);
      const auto& a = tuple_items(args, "set");
      if (!a.empty() && (a[0]->kind == Kind::kList || a[0]->kind == Kind::kTuple)) v->items = a[0]->items;
      return v;
    }
    if (name == "torch.Size") {
      const auto& a = tuple_items(args, "torch.Size");
      auto v = make(Kind::kTuple);
      if (!a.empty()) v->items = tuple_items(a[0], "torch.Size");
      return v;
    }
    if (name == "torch.device" || name == "_codecs.encode") {
      const auto& a = tuple_items(args, name.c_str());
      if (!a.empty() && a[0]->kind == Kind::kString) return make_str(Kind::kString, a[0]->s);
    }
    return object(fn, args);
  }

  ValuePtr persistent(const ValuePtr& pid) {
    const auto& a = tuple_items(pid, "persistent id");
    if (a.size() < 5 || a[0]->kind != Kind::kString || a[0]->s != "storage") fail("unsupported persistent id");
    if (a[1]->kind != Kind::kGlobal) fail("storage type is not a class");
    if (a[2]->kind != Kind::kString) fail("storage key is not a string");
    const c10::ScalarType dtype = storage_dtype(a[1]->s);
    const int64_t numel = int_of(a[4], "storage size");
    if (numel < 0 || numel > kMaxTensorNumel) fail("storage size " + std::to_string(numel) + " out of range");
    auto it = storages_.find(a[2]->s);
    if (it != storages_.end()) return it->second;
    auto v = make(Kind::kStorage);
    v->tensor = loader_(a[2]->s, dtype, numel);
    if (!v->tensor.defined() || v->tensor.dim() != 1 || v->tensor.numel() != numel ||
        v->tensor.scalar_type() != dtype) {
      fail("storage '" + a[2]->s + "' could not be loaded");
    }
    storages_[a[2]->s] = v;
    return v;
  }

  ValuePtr rebuild_tensor(const std::vector<ValuePtr>& a) {
    if (a.size() < 4 || a[0]->kind != Kind::kStorage) fail("_rebuild_tensor_v2: bad arguments");
    const torch::Tensor& storage = a[0]->tensor;
    const int64_t offset = int_of(a[1], "storage offset");
    const auto& size_v = tuple_items(a[2], "tensor size");
    const auto& stride_v = tuple_items(a[3], "tensor stride");
    if (size_v.size() != stride_v.size() || size_v.size() > 16) fail("tensor size/stride mismatch");
    std::vector<int64_t> size, stride;
    int64_t extent = 0;  // highest element index touched
    bool empty = false;
    for (size_t k = 0; k < size_v.size(); ++k) {
      const int64_t sz = int_of(size_v[k], "tensor size"), st = int_of(stride_v[k], "tensor stride");
      if (sz < 0 || st < 0 || sz > kMaxTensorNumel || st > kMaxTensorNumel) fail("tensor size/stride out of range");
      if (sz == 0) empty = true;
      size.push_back(sz);
      stride.push_back(st);
    }
    if (!empty) {
      for (size_t k = 0; k < size.size(); ++k) {
        const __int128 add = static_cast<__int128>(size[k] - 1) * stride[k];
        if (add + extent > kMaxTensorNumel) fail("tensor extent out of range");
        extent += static_cast<int64_t>(add);
      }
      if (offset < 0 || offset + extent >= storage.numel()) fail("tensor exceeds its storage");
    } else if (offset < 0 || offset > storage.numel()) {
      fail("tensor offset exceeds its storage");
    }
    auto v = make(Kind::kTensor);
    v->tensor = empty
                    ? torch::empty(size, storage.options())
                    // a dense layout (channels-last weights and gradients) comes back as it was written, as torch.load
                    // does: a resumed run's gradient accumulation and norms then run in the same memory order
                    : storage.as_strided(size, stride, offset).clone(at::MemoryFormat::Preserve);
    return v;
  }

  const std::string& d_;
  const StorageLoader& loader_;
  size_t pos_ = 0;
  std::vector<ValuePtr> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<size_t, ValuePtr> memo_;
  std::unordered_map<std::string, ValuePtr> storages_;
};

}  // namespace

Value::~Value() {
  std::vector<ValuePtr> pending;
  auto take_children = [&pending](Value& v) {
    for (auto& it : v.items) pending.push_back(std::move(it));
    for (auto& kv : v.dict) {
      pending.push_back(std::move(kv.first));
      pending.push_back(std::move(kv.second));
    }
    if (v.state) pending.push_back(std::move(v.state));
    v.items.clear();
    v.dict.clear();
  };
  take_children(*this);
  while (!pending.empty()) {
    ValuePtr p = std::move(pending.back());
    pending.pop_back();
    if (p && p.use_count() == 1) take_children(*p);  // p then dies without children
  }
}

const Value* Value::get(const std::string& key) const {
  if (kind != Kind::kDict) return nullptr;
  const Value* found = nullptr;
  for (const auto& kv : dict) {
    if (kv.first && kv.first->kind == Kind::kString && kv.first->s == key) found = kv.second.get();  // last wins
  }
  return found;
}

std::string Value::class_name() const {
  const auto dot = s.rfind('.');
  return dot == std::string::npos ? s : s.substr(dot + 1);
}

c10::ScalarType storage_dtype(const std::string& class_name) {
  static const std::vector<std::pair<std::string, c10::ScalarType>> table{
      {"HalfStorage", torch::kHalf},        {"FloatStorage", torch::kFloat}, {"DoubleStorage", torch::kDouble},
      {"LongStorage", torch::kLong},        {"IntStorage", torch::kInt},     {"ShortStorage", torch::kShort},
      {"CharStorage", torch::kChar},        {"ByteStorage", torch::kByte},   {"BoolStorage", torch::kBool},
      {"BFloat16Storage", torch::kBFloat16}};
  const auto dot = class_name.rfind('.');
  const std::string base = dot == std::string::npos ? class_name : class_name.substr(dot + 1);
  for (const auto& [n, t] : table) {
    if (n == base) return t;
  }
  throw std::runtime_error("pickle: unsupported storage type '" + class_name + "'");
}

ValuePtr unpickle(const std::string& data, const StorageLoader& load_storage) {
  return Unpickler(data, load_storage).run();
}

}  // namespace yolo8::pickle
