#pragma once
// Test certificates made with the openssl CLI, for quotad's TLS and the client's checks of it.
#include <cstdlib>
#include <string>

namespace yolo8::quota::testing {

// A CA (ca.pem, ca.key in `dir`, made once) and a server certificate `name`.pem/.key for 127.0.0.1 with
// `serial` valid for `days` (under `faketime` when `ago` is set, so the certificate was issued that long ago:
// "-3 days" with days=1 gives one that expired two days ago). The commands' output goes to openssl.log.
inline bool make_certificate(const std::string& dir, const std::string& name, int serial, int days,
                             const std::string& ago = "") {
  const std::string prefix = ago.empty() ? "" : "faketime '" + ago + "' ";
  const std::string command =
      "cd '" + dir +
      "' && (test -f ca.pem || openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj /CN=reload-ca "
      "-keyout ca.key -out ca.pem) && openssl req -newkey rsa:2048 -nodes -subj /CN=quotad-" +
      name + " -keyout " + name + ".key -out " + name +
      ".csr && printf 'subjectAltName=IP:127.0.0.1\\n' > san.ext && " + prefix + "openssl x509 -req -in " + name +
      ".csr -CA ca.pem -CAkey ca.key -set_serial " + std::to_string(serial) + " -days " + std::to_string(days) +
      " -extfile san.ext -out " + name + ".pem >> openssl.log 2>&1";
  return std::system(command.c_str()) == 0;
}

inline bool have_faketime() { return std::system("command -v faketime >/dev/null 2>&1") == 0; }

}  // namespace yolo8::quota::testing
