#pragma once
// What the admin and ledger commands share: a call to a running quotad's API with the caller's token, and the
// reply printed as a table or, with --json, as it came.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <functional>
#include <string>

namespace yolo8::quota {

struct AdminArgs {
  std::string server = "http://127.0.0.1:8470";
  std::string token;  // default: $QUOTAD_TOKEN
  bool raw_json = false;
};

// --server, --token and --json on `command`.
void add_admin_flags(CLI::App* command, AdminArgs& args);
// The reply's JSON. Throws naming the server when it cannot be reached, or the status and the reason it gave: a
// UsageError for a 4xx other than 408 and 429.
nlohmann::json admin_call(const AdminArgs& args, const std::string& method, const std::string& path,
                          const std::string& body = "");
// Prints the reply with `table`, or as indented JSON with --json or when there is no table for it; 0.
int print_reply(const AdminArgs& args, const nlohmann::json& reply,
                const std::function<void(const nlohmann::json&)>& table = nullptr);

}  // namespace yolo8::quota
