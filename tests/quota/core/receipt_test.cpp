#include "quota/core/receipt.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "quota/core/codec.h"

namespace yolo8::quota {
namespace {

LeaseReceipt sample_receipt() {
  LeaseReceipt receipt;
  receipt.lease_id = 7;
  receipt.team = "team-cv";
  receipt.user = "alice";
  receipt.job = "detector";
  receipt.model = "yolov8s";
  receipt.priority = "normal";
  receipt.shared = true;
  receipt.memory_gib = 6.3;
  receipt.devices = {"node-a:3"};
  receipt.granted_ms = 1764000000123;
  receipt.ttl_s = 60;
  return receipt;
}

const std::string kKey(kReceiptKeyBytes, '\x5a');

TEST(LeaseReceipt, SignedReceiptVerifiesAfterAJsonRoundTrip) {
  LeaseReceipt receipt = sample_receipt();
  receipt.signature = receipt_signature(receipt, kKey);
  EXPECT_EQ(receipt.signature.size(), 64u);  // SHA-256, hex
  const LeaseReceipt back = receipt_from_json(nlohmann::json::parse(to_json(receipt).dump()));
  EXPECT_TRUE(receipt_verifies(back, kKey));
  EXPECT_EQ(canonical_receipt(back), canonical_receipt(receipt));
}

TEST(LeaseReceipt, EveryAlteredFactOrAnotherKeyFailsTheSignature) {
  LeaseReceipt receipt = sample_receipt();
  receipt.signature = receipt_signature(receipt, kKey);
  EXPECT_FALSE(receipt_verifies(receipt, std::string(kReceiptKeyBytes, '\x5b')));
  EXPECT_FALSE(receipt_verifies(receipt, ""));
  const std::vector<void (*)(LeaseReceipt&)> edits = {
      [](LeaseReceipt& r) { r.lease_id = 8; },        [](LeaseReceipt& r) { r.team = "team-robotics"; },
      [](LeaseReceipt& r) { r.user = "bob"; },        [](LeaseReceipt& r) { r.job = "other"; },
      [](LeaseReceipt& r) { r.model = "yolov8x"; },   [](LeaseReceipt& r) { r.priority = "critical"; },
      [](LeaseReceipt& r) { r.preemptible = false; }, [](LeaseReceipt& r) { r.shared = false; },
      [](LeaseReceipt& r) { r.memory_gib = 8; },      [](LeaseReceipt& r) { r.devices = {"node-a:4"}; },
      [](LeaseReceipt& r) { r.granted_ms += 1000; },  [](LeaseReceipt& r) { r.ttl_s = 600; },
      [](LeaseReceipt& r) { r.signature[0] ^= 1; }};
  for (size_t i = 0; i < edits.size(); ++i) {
    LeaseReceipt altered = receipt;
    edits[i](altered);
    EXPECT_FALSE(receipt_verifies(altered, kKey)) << "edit " << i;
  }
}

TEST(LeaseReceipt, AMissingOrMistypedFieldIsNamed) {
  nlohmann::json body = to_json(sample_receipt());
  body.erase("devices");
  EXPECT_THROW(
      {
        try {
          receipt_from_json(body);
        } catch (const RequestError& error) {
          EXPECT_STREQ(error.what(), "receipt.devices: required");
          throw;
        }
      },
      RequestError);
  body = to_json(sample_receipt());
  body["granted_ms"] = "yesterday";
  EXPECT_THROW(receipt_from_json(body), RequestError);
}

TEST(LeaseReceipt, KeysAreRandomAndRoundTripThroughHex) {
  const std::string a = new_receipt_key_hex();
  EXPECT_EQ(a.size(), 2 * kReceiptKeyBytes);
  EXPECT_NE(a, new_receipt_key_hex());
  EXPECT_EQ(key_from_hex(a).size(), kReceiptKeyBytes);
  EXPECT_THROW(key_from_hex("abc"), std::invalid_argument);
  EXPECT_THROW(key_from_hex("zz"), std::invalid_argument);
}

}  // namespace
}  // namespace yolo8::quota
