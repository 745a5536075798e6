// The pickle reader on plain Python values (bytes written by CPython's pickle, protocols 2 and 4).
#include "models/pickle_reader.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace yolo8::pickle {
namespace {

// pickle.dumps({'a': [1, 2.5, None, True, 'x'], 'b': (1, -300, 2**40, -2**40), 'c': {1: 'one'},
//               'd': OrderedDict(k=b'\\x00\\x01'), 'e': {1, 2}}, protocol=P)
const std::string kProto2(
    "\x80\x02\x7d\x71\x00\x28\x58\x01\x00\x00\x00\x61\x71\x01\x5d\x71\x02\x28\x4b\x01\x47\x40\x04\x00"
    "\x00\x00\x00\x00\x00\x4e\x88\x58\x01\x00\x00\x00\x78\x71\x03\x65\x58\x01\x00\x00\x00\x62\x71\x04"
    "\x28\x4b\x01\x4a\xd4\xfe\xff\xff\x8a\x06\x00\x00\x00\x00\x00\x01\x8a\x06\x00\x00\x00\x00\x00\xff"
    "\x74\x71\x05\x58\x01\x00\x00\x00\x63\x71\x06\x7d\x71\x07\x4b\x01\x58\x03\x00\x00\x00\x6f\x6e\x65"
    "\x71\x08\x73\x58\x01\x00\x00\x00\x64\x71\x09\x63\x63\x6f\x6c\x6c\x65\x63\x74\x69\x6f\x6e\x73\x0a"
    "\x4f\x72\x64\x65\x72\x65\x64\x44\x69\x63\x74\x0a\x71\x0a\x29\x52\x71\x0b\x58\x01\x00\x00\x00\x6b"
    "\x71\x0c\x63\x5f\x63\x6f\x64\x65\x63\x73\x0a\x65\x6e\x63\x6f\x64\x65\x0a\x71\x0d\x58\x02\x00\x00"
    "\x00\x00\x01\x71\x0e\x58\x06\x00\x00\x00\x6c\x61\x74\x69\x6e\x31\x71\x0f\x86\x71\x10\x52\x71\x11"
    "\x73\x58\x01\x00\x00\x00\x65\x71\x12\x63\x5f\x5f\x62\x75\x69\x6c\x74\x69\x6e\x5f\x5f\x0a\x73\x65"
    "\x74\x0a\x71\x13\x5d\x71\x14\x28\x4b\x01\x4b\x02\x65\x85\x71\x15\x52\x71\x16\x75\x2e",
    237);
const std::string kProto4(
    "\x80\x04\x95\x86\x00\x00\x00\x00\x00\x00\x00\x7d\x94\x28\x8c\x01\x61\x94\x5d\x94\x28\x4b\x01\x47"
    "\x40\x04\x00\x00\x00\x00\x00\x00\x4e\x88\x8c\x01\x78\x94\x65\x8c\x01\x62\x94\x28\x4b\x01\x4a\xd4"
    "\xfe\xff\xff\x8a\x06\x00\x00\x00\x00\x00\x01\x8a\x06\x00\x00\x00\x00\x00\xff\x74\x94\x8c\x01\x63"
    "\x94\x7d\x94\x4b\x01\x8c\x03\x6f\x6e\x65\x94\x73\x8c\x01\x64\x94\x8c\x0b\x63\x6f\x6c\x6c\x65\x63"
    "\x74\x69\x6f\x6e\x73\x94\x8c\x0b\x4f\x72\x64\x65\x72\x65\x64\x44\x69\x63\x74\x94\x93\x94\x29\x52"
    "\x94\x8c\x01\x6b\x94\x43\x02\x00\x01\x94\x73\x8c\x01\x65\x94\x8f\x94\x28\x4b\x01\x4b\x02\x90\x75"
    "\x2e",
    145);

torch::Tensor no_storage(const std::string&, c10::ScalarType, int64_t) { throw std::runtime_error("no storages here"); }

void check_values(const ValuePtr& root) {
  ASSERT_EQ(root->kind, Kind::kDict);
  const Value* a = root->get("a");
  ASSERT_TRUE(a && a->kind == Kind::kList && a->items.size() == 5);
  EXPECT_EQ(a->items[0]->i, 1);
  EXPECT_DOUBLE_EQ(a->items[1]->f, 2.5);
  EXPECT_TRUE(a->items[2]->is_none());
  EXPECT_TRUE(a->items[3]->kind == Kind::kBool && a->items[3]->b);
  EXPECT_EQ(a->items[4]->s, "x");
  const Value* b = root->get("b");
  ASSERT_TRUE(b && b->kind == Kind::kTuple && b->items.size() == 4);
  EXPECT_EQ(b->items[1]->i, -300);
  EXPECT_EQ(b->items[2]->i, int64_t{1} << 40);
  EXPECT_EQ(b->items[3]->i, -(int64_t{1} << 40));
  const Value* c = root->get("c");
  ASSERT_TRUE(c && c->kind == Kind::kDict && c->dict.size() == 1);
  EXPECT_EQ(c->dict[0].first->i, 1);
  EXPECT_EQ(c->dict[0].second->s, "one");
  const Value* d = root->get("d");
  ASSERT_TRUE(d && d->kind == Kind::kDict);
  ASSERT_TRUE(d->get("k"));
  EXPECT_EQ(d->get("k")->s, std::string("\x00\x01", 2));
  const Value* e = root->get("e");
  ASSERT_TRUE(e && e->kind == Kind::kList);
  EXPECT_EQ(e->items.size(), 2u);
  EXPECT_EQ(root->get("missing"), nullptr);
}

TEST(PickleReader, Protocol2Values) { check_values(unpickle(kProto2, no_storage)); }
TEST(PickleReader, Protocol4Values) { check_values(unpickle(kProto4, no_storage)); }

TEST(PickleReader, MalformedInputThrows) {
  for (size_t cut = 0; cut < kProto2.size(); ++cut) {
    EXPECT_THROW(unpickle(kProto2.substr(0, cut), no_storage), std::runtime_error) << cut;
  }
  EXPECT_THROW(unpickle(std::string("\x80\x02h\x07.", 5), no_storage), std::runtime_error);  // memo never set
  EXPECT_THROW(unpickle(std::string("\x80\x02X\xff\xff\xff\x7f"
                                    "ab.",
                                    10),
                        no_storage),
               std::runtime_error);
  EXPECT_THROW(unpickle(std::string("\x80\x02\xff.", 4), no_storage), std::runtime_error);  // unknown opcode
  EXPECT_THROW(unpickle(std::string("\x80\x02u.", 4), no_storage), std::runtime_error);     // SETITEMS, no mark
}

TEST(PickleReader, DeepNestingDoesNotOverflow) {
  // ((((...)))) a million levels deep: n MARKs, then n TUPLEs each wrapping the previous one.
  const size_t n = 1000000;
  std::string data("\x80\x02", 2);
  data += std::string(n, '(');
  data += std::string(n, 't');
  data += '.';
  auto v = unpickle(data, no_storage);
  EXPECT_EQ(v->kind, Kind::kTuple);
  v.reset();  // must not recurse a million frames
  SUCCEED();
}

TEST(PickleReader, StorageDtypes) {
  EXPECT_EQ(storage_dtype("torch.HalfStorage"), torch::kHalf);
  EXPECT_EQ(storage_dtype("torch.LongStorage"), torch::kLong);
  EXPECT_EQ(storage_dtype("FloatStorage"), torch::kFloat);
  EXPECT_THROW(storage_dtype("torch.QInt8Storage"), std::runtime_error);
}

}  // namespace
}  // namespace yolo8::pickle
