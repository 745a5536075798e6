#pragma once
// SHA-256 of bearer tokens and the comparison of stored digests, both from OpenSSL's libcrypto.
#include <string>

namespace yolo8::quota {

// Lower-case hex digest of `data`.
std::string sha256_hex(const std::string& data);

// Whether two digests are equal, in time that depends on their length only (CRYPTO_memcmp): a token guess learns
// nothing from how many leading characters matched. Digests of different lengths are unequal.
bool digests_equal(const std::string& left, const std::string& right);

}  // namespace yolo8::quota
