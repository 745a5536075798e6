#pragma once
// quotad's TLS certificate and key as GnuTLS serves them: loaded from the PEM files, checked to belong together,
// swapped in place on a reload (libmicrohttpd asks for the certificate at every handshake through
// MHD_OPTION_HTTPS_CERT_CALLBACK, so new connections get the new one and open ones keep theirs).
#include <cstdint>
#include <memory>
#include <string>

namespace yolo8::quota {

// What the served certificate (the chain's first) says.
struct CertificateFacts {
  int64_t not_after_ms = 0;  // UTC
  std::string subject;       // RFC 4514 DN
  std::string serial;        // hex
};

enum class CertificateState { kValid, kExpiresSoon, kExpired };
// Expired at `now_ms`, or within `warn_ms` of it.
CertificateState certificate_state(int64_t not_after_ms, int64_t now_ms, int64_t warn_ms);

class TlsCredentials {
 public:
  // Reads both PEM files; throws std::runtime_error naming the file when one cannot be read or parsed, or when
  // the key is not the certificate's.
  static std::shared_ptr<const TlsCredentials> load(const std::string& cert_file, const std::string& key_file);
  ~TlsCredentials();
  TlsCredentials(const TlsCredentials&) = delete;
  TlsCredentials& operator=(const TlsCredentials&) = delete;
  const CertificateFacts& facts() const { return facts_; }
  // GnuTLS' gnutls_certificate_retrieve_function2 answer: the chain and the key (owned here).
  void hand_over(void** pcert, unsigned* pcert_length, void** pkey) const;

 private:
  TlsCredentials() = default;
  struct Gnutls;
  std::unique_ptr<Gnutls> gnutls_;
  CertificateFacts facts_;
};

}  // namespace yolo8::quota
