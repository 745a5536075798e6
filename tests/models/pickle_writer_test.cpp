// The pickle writer read back by our own reader and by LibTorch's torch::pickle_load (Python's torch.load reads
// the same files in tests/peer: Peer.UltralyticsOpensOurCheckpoints).
#include "models/pickle_writer.h"

#include <caffe2/serialize/inline_container.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

#include "models/pickle_reader.h"

namespace yolo8::pickle {
namespace {

bool bitwise_equal(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || !a.sizes().equals(b.sizes())) return false;
  const auto ca = a.contiguous(), cb = b.contiguous();
  return std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) == 0;
}

// Zip + data.pkl through our reader, as models/weights.cpp reads Ultralytics files.
ValuePtr read_back(const std::vector<char>& archive) {
  const std::string bytes(archive.begin(), archive.end());
  std::istringstream stream(bytes);
  caffe2::serialize::PyTorchStreamReader zip(&stream);
  auto [pkl, size] = zip.getRecord("data.pkl");
  const StorageLoader loader = [&zip](const std::string& key, c10::ScalarType dtype, int64_t numel) {
    auto [ptr, n] = zip.getRecord("data/" + key);
    EXPECT_EQ(n, static_cast<size_t>(numel) * c10::elementSize(dtype));
    torch::Tensor t = torch::empty({numel}, torch::TensorOptions().dtype(dtype));
    std::memcpy(t.data_ptr(), ptr.get(), n);
    return t;
  };
  return unpickle(std::string(static_cast<const char*>(pkl.get()), size), loader);
}

std::vector<char> archive_of(Writer& w) {
  const auto storages = w.storages();
  return save_archive(w.finish(), storages);
}

struct Sample {
  torch::Tensor weights = torch::randn({4, 3, 3, 3});
  torch::Tensor half = torch::randn({5}).to(torch::kHalf);
  torch::Tensor bytes = torch::arange(0, 200, torch::kInt64).to(torch::kUInt8);
  torch::Tensor base = torch::arange(24, torch::kFloat).reshape({4, 6});
  torch::Tensor view = base.slice(1, 2, 5).t();  // offset 2, strides (1, 6): a view of base's storage

  c10::IValue value() const {
    c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
    d.insert("none", c10::IValue());
    d.insert("yes", true);
    d.insert("no", false);
    c10::impl::GenericList ints(c10::AnyType::get());
    for (const int64_t i : {int64_t{0}, int64_t{255}, int64_t{256}, int64_t{65535}, int64_t{65536}, int64_t{-1},
                            int64_t{std::numeric_limits<int32_t>::min()}, int64_t{std::numeric_limits<int32_t>::max()},
                            int64_t{1} << 40, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()})
      ints.push_back(i);
    d.insert("ints", ints);
    c10::impl::GenericList reals(c10::AnyType::get());
    for (const double f : {0.1, -0.0, 1e-300, 0.937, std::numeric_limits<double>::infinity()}) reals.push_back(f);
    d.insert("reals", reals);
    d.insert("text", std::string("yolov8n \xc3\xa9t\xc3\xa9"));
    d.insert("empty", std::string());
    c10::impl::GenericDict tensors(c10::StringType::get(), c10::TensorType::get());
    tensors.insert("weights", weights);
    tensors.insert("half", half);
    tensors.insert("bytes", bytes);
    tensors.insert("base", base);
    tensors.insert("view", view);
    d.insert("tensors", tensors);
    return d;
  }
};

TEST(PickleWriter, ValuesRoundTripThroughOurReaderBitwise) {
  torch::manual_seed(0);
  const Sample sample;
  Writer w;
  write_ivalue(w, sample.value());
  const ValuePtr root = read_back(archive_of(w));
  ASSERT_EQ(root->kind, Kind::kDict);
  EXPECT_EQ(root->get("none")->kind, Kind::kNone);
  EXPECT_TRUE(root->get("yes")->kind == Kind::kBool && root->get("yes")->b);
  EXPECT_TRUE(root->get("no")->kind == Kind::kBool && !root->get("no")->b);
  const auto expected = sample.value().toGenericDict();
  const auto& ints = root->get("ints")->items;
  ASSERT_EQ(ints.size(), expected.at("ints").toListRef().size());
  for (size_t k = 0; k < ints.size(); ++k) EXPECT_EQ(ints[k]->i, expected.at("ints").toListRef()[k].toInt()) << k;
  const auto& reals = root->get("reals")->items;
  ASSERT_EQ(reals.size(), 5u);
  for (size_t k = 0; k < reals.size(); ++k) {
    const double want = expected.at("reals").toListRef()[k].toDouble();
    EXPECT_EQ(std::memcmp(&reals[k]->f, &want, sizeof want), 0) << k;  // bitwise: -0.0 stays -0.0
  }
  EXPECT_EQ(root->get("text")->s, "yolov8n \xc3\xa9t\xc3\xa9");
  EXPECT_EQ(root->get("empty")->kind, Kind::kString);
  EXPECT_TRUE(root->get("empty")->s.empty());
  const Value* t = root->get("tensors");
  ASSERT_TRUE(t && t->kind == Kind::kDict);
  EXPECT_TRUE(bitwise_equal(t->get("weights")->tensor, sample.weights));
  EXPECT_TRUE(bitwise_equal(t->get("half")->tensor, sample.half));
  EXPECT_TRUE(bitwise_equal(t->get("bytes")->tensor, sample.bytes));
  EXPECT_TRUE(bitwise_equal(t->get("base")->tensor, sample.base));
  EXPECT_TRUE(bitwise_equal(t->get("view")->tensor, sample.view));
  EXPECT_EQ(w.storages().size(), 4u);  // the view shares base's storage
}

TEST(PickleWriter, TorchPickleLoadReadsWhatItWrites) {
  torch::manual_seed(1);
  const Sample sample;
  Writer w;
  write_ivalue(w, sample.value());
  const c10::IValue loaded = torch::pickle_load(archive_of(w));
  ASSERT_TRUE(loaded.isGenericDict());
  const auto d = loaded.toGenericDict();
  EXPECT_TRUE(d.at("none").isNone());
  EXPECT_TRUE(d.at("yes").toBool());
  EXPECT_EQ(d.at("ints").toListRef().back().toInt(), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(d.at("ints").toListRef()[9].toInt(), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(d.at("reals").toListRef()[3].toDouble(), 0.937);
  EXPECT_EQ(d.at("text").toStringRef(), "yolov8n \xc3\xa9t\xc3\xa9");
  const auto tensors = d.at("tensors").toGenericDict();
  EXPECT_TRUE(bitwise_equal(tensors.at("weights").toTensor(), sample.weights));
  EXPECT_TRUE(bitwise_equal(tensors.at("half").toTensor(), sample.half));
  EXPECT_TRUE(bitwise_equal(tensors.at("bytes").toTensor(), sample.bytes));
  EXPECT_TRUE(bitwise_equal(tensors.at("view").toTensor(), sample.view));
}

TEST(PickleWriter, ObjectsAreCallsAndMemoKeepsIdentity) {
  Writer w;
  w.empty_dict();
  w.string("model");
  w.global("ultralytics.nn.tasks", "DetectionModel");
  w.mark();
  w.integer(3);
  w.tuple();
  w.reduce();
  w.empty_dict();
  w.string("names");
  w.string("x");
  w.set_item();
  w.build();
  const auto model = w.memoize();
  w.global("builtins", "print");
  w.get(model);
  w.tuple(1);
  w.reduce();
  w.pop();  // the call's result is dropped; the model stays
  w.set_item();
  w.string("same");
  w.get(model);
  w.set_item();
  const ValuePtr root = read_back(archive_of(w));
  const Value* m = root->get("model");
  ASSERT_TRUE(m && m->kind == Kind::kObject);
  EXPECT_EQ(m->s, "ultralytics.nn.tasks.DetectionModel");
  ASSERT_EQ(m->items.size(), 1u);
  EXPECT_EQ(m->items[0]->i, 3);
  ASSERT_TRUE(m->state);
  EXPECT_EQ(m->state->get("names")->s, "x");
  EXPECT_EQ(root->get("same"), m);
  EXPECT_THROW(w.get(99), std::invalid_argument);
}

TEST(PickleWriter, YamlScalarsResolveAsPyYamlSafeLoad) {
  const YAML::Node doc = YAML::Load(
      "a: [None, True, false, 0.33, 64, -3, nearest, 'True', \"7\", null, ~, 1e5, .5, 1.0e-3, nn.Upsample, yes]\n"
      "nested: {k: [1, [2]]}\nempty:\n");
  Writer w;
  write_yaml(w, doc);
  const ValuePtr root = read_back(archive_of(w));
  const auto& a = root->get("a")->items;
  ASSERT_EQ(a.size(), 16u);
  EXPECT_TRUE(a[0]->kind == Kind::kString && a[0]->s == "None");  // Ultralytics' parse_model evaluates it
  EXPECT_TRUE(a[1]->kind == Kind::kBool && a[1]->b);
  EXPECT_TRUE(a[2]->kind == Kind::kBool && !a[2]->b);
  EXPECT_TRUE(a[3]->kind == Kind::kFloat && a[3]->f == 0.33);
  EXPECT_TRUE(a[4]->kind == Kind::kInt && a[4]->i == 64);
  EXPECT_TRUE(a[5]->kind == Kind::kInt && a[5]->i == -3);
  EXPECT_TRUE(a[6]->kind == Kind::kString && a[6]->s == "nearest");
  EXPECT_TRUE(a[7]->kind == Kind::kString && a[7]->s == "True");  // quoted: text
  EXPECT_TRUE(a[8]->kind == Kind::kString && a[8]->s == "7");
  EXPECT_EQ(a[9]->kind, Kind::kNone);
  EXPECT_EQ(a[10]->kind, Kind::kNone);
  EXPECT_TRUE(a[11]->kind == Kind::kString && a[11]->s == "1e5");  // YAML 1.1 floats need a dot
  EXPECT_TRUE(a[12]->kind == Kind::kFloat && a[12]->f == 0.5);
  EXPECT_TRUE(a[13]->kind == Kind::kFloat && a[13]->f == 1.0e-3);
  EXPECT_TRUE(a[14]->kind == Kind::kString && a[14]->s == "nn.Upsample");
  EXPECT_TRUE(a[15]->kind == Kind::kBool && a[15]->b);
  const Value* k = root->get("nested")->get("k");
  ASSERT_TRUE(k && k->items.size() == 2u);
  EXPECT_EQ(k->items[1]->items[0]->i, 2);
  EXPECT_EQ(root->get("empty")->kind, Kind::kNone);
}

}  // namespace
}  // namespace yolo8::pickle
