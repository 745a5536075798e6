#include "trainer/export/onnx_info.h"

#include <onnx/onnx_pb.h>

#include <cctype>
#include <fstream>
#include <map>
#include <stdexcept>

namespace yolo8 {
namespace {

class DictParser {
 public:
  explicit DictParser(const std::string& text) : text_(text) {}

  std::map<int64_t, std::string> parse() {
    std::map<int64_t, std::string> entries;
    expect('{');
    skip_spaces();
    if (peek() == '}') {
      ++at_;
      return entries;
    }
    for (;;) {
      const int64_t id = integer();
      expect(':');
      std::string name = quoted();
      if (!entries.emplace(id, std::move(name)).second) fail("id " + std::to_string(id) + " appears twice");
      skip_spaces();
      if (peek() == ',') {
        ++at_;
        continue;
      }
      expect('}');
      skip_spaces();
      if (at_ != text_.size()) fail("text after the closing '}'");
      return entries;
    }
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw std::invalid_argument("names: " + what + " at character " + std::to_string(at_ + 1));
  }
  char peek() const { return at_ < text_.size() ? text_[at_] : '\0'; }
  void skip_spaces() {
    while (at_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[at_]))) ++at_;
  }
  void expect(char c) {
    skip_spaces();
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++at_;
  }
  int64_t integer() {
    skip_spaces();
    const size_t start = at_;
    while (at_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[at_]))) ++at_;
    if (at_ == start || at_ - start > 9) fail("expected a class id");
    return std::stoll(text_.substr(start, at_ - start));
  }
  // A Python string literal as repr() writes it: '...' or "...", backslash escapes.
  std::string quoted() {
    skip_spaces();
    const char quote = peek();
    if (quote != '\'' && quote != '"') fail("expected a quoted name");
    ++at_;
    std::string out;
    while (at_ < text_.size() && text_[at_] != quote) {
      char c = text_[at_++];
      if (c == '\\') {
        if (at_ >= text_.size()) break;
        const char escaped = text_[at_++];
        c = escaped == 'n' ? '\n' : escaped == 't' ? '\t' : escaped;
      }
      out += c;
    }
    if (at_ >= text_.size()) fail("unterminated name");
    ++at_;
    return out;
  }

  const std::string& text_;
  size_t at_ = 0;
};

int64_t fixed_dim(const onnx::TensorShapeProto& shape, int index) {
  if (shape.dim_size() <= index || !shape.dim(index).has_dim_value()) return 0;
  return shape.dim(index).dim_value();
}

}  // namespace

std::vector<std::string> parse_python_names_dict(const std::string& text) {
  const std::map<int64_t, std::string> entries = DictParser(text).parse();
  std::vector<std::string> names;
  for (const auto& [id, name] : entries) {
    if (id != static_cast<int64_t>(names.size())) {
      throw std::invalid_argument("names: ids must run 0.." + std::to_string(entries.size() - 1) + ", missing " +
                                  std::to_string(names.size()));
    }
    names.push_back(name);
  }
  return names;
}

OnnxModelInfo read_onnx_info(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open");
  onnx::ModelProto model;
  if (!model.ParseFromIstream(&in) || !model.has_graph() || model.graph().input_size() == 0 ||
      model.graph().output_size() == 0) {
    throw std::runtime_error(path + ": not an ONNX model (no graph with inputs and outputs)");
  }
  OnnxModelInfo info;
  const onnx::ValueInfoProto& input = model.graph().input(0);
  info.input_name = input.name();
  info.output_name = model.graph().output(0).name();
  if (input.type().has_tensor_type() && input.type().tensor_type().has_shape()) {
    info.height = fixed_dim(input.type().tensor_type().shape(), 2);
    info.width = fixed_dim(input.type().tensor_type().shape(), 3);
  }
  for (const onnx::StringStringEntryProto& entry : model.metadata_props()) {
    try {
      if (entry.key() == "names") info.names = parse_python_names_dict(entry.value());
      if (entry.key() == "stride") info.stride = std::stoll(entry.value());
    } catch (const std::exception& error) {
      throw std::runtime_error(path + ": metadata '" + entry.key() + "' does not parse: " + error.what());
    }
  }
  if (info.stride <= 0) throw std::runtime_error(path + ": metadata 'stride' must be positive");
  return info;
}

}  // namespace yolo8
