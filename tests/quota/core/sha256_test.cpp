#include "quota/core/sha256.h"

#include <gtest/gtest.h>

namespace yolo8::quota {
namespace {

TEST(Sha256, KnownVectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  // two-block message and a multi-block one
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha256_hex(std::string(1000, 'a')), "41edece42d63e8d9bf515a9ba6932e1c20cbc9f5a5d134645adb5db1b9737ea3");
  EXPECT_EQ(sha256_hex("alice-token"), "9c220f200955d76c0a38d308225e0ef10c5f971acaf2f8d1d8f732affa5bd1dc");
}

TEST(Sha256, DigestsEqualOnlyWhenEveryCharacterAndTheLengthMatch) {
  const std::string digest = sha256_hex("alice-token");
  EXPECT_TRUE(digests_equal(digest, sha256_hex("alice-token")));
  std::string last_differs = digest;
  last_differs.back() = last_differs.back() == '0' ? '1' : '0';
  EXPECT_FALSE(digests_equal(digest, last_differs));
  EXPECT_FALSE(digests_equal(digest, digest.substr(0, 63)));  // a prefix is not a match
  EXPECT_FALSE(digests_equal(digest, ""));
  EXPECT_TRUE(digests_equal("", ""));
}

}  // namespace
}  // namespace yolo8::quota
