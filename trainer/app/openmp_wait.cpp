// Linked into the yolo8 executable only (not yolo8_app): the getenv that libgomp's load-time constructor calls.
//
// libgomp reads OMP_WAIT_POLICY once, in its constructor, before main(); a setenv in main is too late. The
// executable comes first in the dynamic linker's symbol search, so this definition of getenv is the one every
// shared library binds to (symbol interposition, as a malloc replacement is). It answers from the environment
// as libc's does, and answers OMP_WAIT_POLICY=PASSIVE when the environment sets neither it nor GOMP_SPINCOUNT
// (default_openmp_wait_policy). main() then sets the variable for real (set_default_openmp_wait_policy), so
// what the libraries read and what child processes inherit agree. Before, yolo8 re-executed itself to the same
// end and so loaded LibTorch twice.
#include <cstring>

#include "trainer/app/threads.h"

extern char** environ;

namespace {

// libc's getenv, walking the same `environ`: no allocation, no lock (libc takes none either).
char* lookup(const char* name) {
  if (environ == nullptr) return nullptr;
  const size_t length = std::strlen(name);
  for (char** entry = environ; *entry != nullptr; ++entry) {
    if (std::strncmp(*entry, name, length) == 0 && (*entry)[length] == '=') return *entry + length + 1;
  }
  return nullptr;
}

char g_passive[] = "PASSIVE";

}  // namespace

extern "C" char* getenv(const char* name) noexcept {
  char* value = lookup(name);
  if (value != nullptr || std::strcmp(name, "OMP_WAIT_POLICY") != 0) return value;
  const char* fallback = yolo8::default_openmp_wait_policy(nullptr, lookup("GOMP_SPINCOUNT"));
  return fallback != nullptr ? g_passive : nullptr;
}
