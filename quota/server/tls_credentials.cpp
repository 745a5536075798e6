#include "quota/server/tls_credentials.h"

#include <gnutls/abstract.h>
#include <gnutls/gnutls.h>
#include <gnutls/x509.h>

#include <fstream>
#include <sstream>
#include <stdexcept>
#include <vector>

namespace yolo8::quota {

namespace {

constexpr unsigned kMaxChain = 16;

std::string read_file(const std::string& path, const char* flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(std::string(flag) + ": cannot read '" + path + "'");
  std::ostringstream text;
  text << in.rdbuf();
  if (text.str().find("-----BEGIN ") == std::string::npos) {
    throw std::runtime_error(std::string(flag) + ": '" + path + "' is not a PEM file");
  }
  return text.str();
}

gnutls_datum_t datum(const std::string& text) {
  return {reinterpret_cast<unsigned char*>(const_cast<char*>(text.data())), static_cast<unsigned>(text.size())};
}

}  // namespace

CertificateState certificate_state(int64_t not_after_ms, int64_t now_ms, int64_t warn_ms) {
  if (not_after_ms <= now_ms) return CertificateState::kExpired;
  if (not_after_ms - now_ms <= warn_ms) return CertificateState::kExpiresSoon;
  return CertificateState::kValid;
}

struct TlsCredentials::Gnutls {
  std::vector<gnutls_pcert_st> chain;
  unsigned count = 0;
  gnutls_privkey_t key = nullptr;
  ~Gnutls() {
    for (unsigned i = 0; i < count; ++i) gnutls_pcert_deinit(&chain[i]);
    if (key != nullptr) gnutls_privkey_deinit(key);
  }
};

std::shared_ptr<const TlsCredentials> TlsCredentials::load(const std::string& cert_file, const std::string& key_file) {
  const std::string cert_pem = read_file(cert_file, "--tls-cert");
  const std::string key_pem = read_file(key_file, "--tls-key");
  std::shared_ptr<TlsCredentials> made(new TlsCredentials());
  made->gnutls_ = std::make_unique<Gnutls>();
  Gnutls& g = *made->gnutls_;
  g.chain.resize(kMaxChain);
  g.count = kMaxChain;
  gnutls_datum_t cert_data = datum(cert_pem);
  if (const int rc = gnutls_pcert_list_import_x509_raw(g.chain.data(), &g.count, &cert_data, GNUTLS_X509_FMT_PEM, 0);
      rc < 0 || g.count == 0) {
    g.count = 0;
    throw std::runtime_error("--tls-cert: '" + cert_file + "': " + (rc < 0 ? gnutls_strerror(rc) : "no certificate"));
  }
  gnutls_datum_t key_data = datum(key_pem);
  if (gnutls_privkey_init(&g.key) < 0) throw std::runtime_error("--tls-key: out of memory");
  if (const int rc = gnutls_privkey_import_x509_raw(g.key, &key_data, GNUTLS_X509_FMT_PEM, nullptr, 0); rc < 0) {
    throw std::runtime_error("--tls-key: '" + key_file + "': " + gnutls_strerror(rc));
  }
  // the key must be the certificate's: GnuTLS' own pairing check, as MHD_OPTION_HTTPS_MEM_KEY would do it
  gnutls_certificate_credentials_t check = nullptr;
  gnutls_certificate_allocate_credentials(&check);
  const int paired = gnutls_certificate_set_x509_key_mem(check, &cert_data, &key_data, GNUTLS_X509_FMT_PEM);
  gnutls_certificate_free_credentials(check);
  if (paired < 0) {
    throw std::runtime_error("--tls-key: '" + key_file + "' is not the key of '" + cert_file +
                             "': " + gnutls_strerror(paired));
  }
  gnutls_x509_crt_t crt = nullptr;
  gnutls_x509_crt_init(&crt);
  if (gnutls_x509_crt_import(crt, &g.chain[0].cert, GNUTLS_X509_FMT_DER) < 0) {
    gnutls_x509_crt_deinit(crt);
    throw std::runtime_error("--tls-cert: '" + cert_file + "': cannot read the certificate");
  }
  made->facts_.not_after_ms = static_cast<int64_t>(gnutls_x509_crt_get_expiration_time(crt)) * 1000;
  gnutls_datum_t dn{};
  if (gnutls_x509_crt_get_dn3(crt, &dn, 0) >= 0) {
    made->facts_.subject.assign(reinterpret_cast<const char*>(dn.data), dn.size);
    gnutls_free(dn.data);
  }
  unsigned char serial[64];
  size_t serial_size = sizeof serial;
  if (gnutls_x509_crt_get_serial(crt, serial, &serial_size) >= 0) {
    static const char* kHex = "0123456789abcdef";
    for (size_t i = 0; i < serial_size; ++i) {
      made->facts_.serial += kHex[serial[i] >> 4];
      made->facts_.serial += kHex[serial[i] & 15];
    }
  }
  gnutls_x509_crt_deinit(crt);
  return made;
}

TlsCredentials::~TlsCredentials() = default;

void TlsCredentials::hand_over(void** pcert, unsigned* pcert_length, void** pkey) const {
  *pcert = gnutls_->chain.data();
  *pcert_length = gnutls_->count;
  *pkey = gnutls_->key;
}

}  // namespace yolo8::quota
