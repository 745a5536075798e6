#include "quota/app/admin_http.h"

#include <httplib.h>

#include <cstdlib>
#include <iostream>
#include <stdexcept>

#include "common/exit_codes.h"
#include "quota/app/command_table.h"

namespace yolo8::quota {

using nlohmann::json;

void add_admin_flags(CLI::App* command, AdminArgs& args) {
  command->add_option("--server", args.server, "quotad URL")->capture_default_str();
  command->add_option("--token", args.token, "bearer token (default: $QUOTAD_TOKEN)");
  command->add_flag("--json", args.raw_json, "print the raw JSON");
}

json admin_call(const AdminArgs& args, const std::string& method, const std::string& path, const std::string& body) {
  httplib::Client cli(args.server);
  cli.set_connection_timeout(5, 0);
  cli.set_read_timeout(10, 0);
  httplib::Headers headers;
  std::string token = args.token;
  if (token.empty()) {
    if (const char* env_token = std::getenv("QUOTAD_TOKEN")) token = env_token;
  }
  if (!token.empty()) headers.emplace("Authorization", "Bearer " + token);
  auto res =
      method == "GET" ? cli.Get(path.c_str(), headers) : cli.Post(path.c_str(), headers, body, "application/json");
  if (!res) throw std::runtime_error("cannot reach " + args.server + ": " + httplib::to_string(res.error()));
  json reply;
  try {
    reply = json::parse(res->body);
  } catch (const json::exception&) {
    reply = json{{"reason", res->body}};
  }
  const std::string refusal = "HTTP " + std::to_string(res->status) + ": " + reply.value("reason", res->body);
  // a refusal of the request itself (bad token, role, id, value) stays one when retried; a busy or failing server not
  if (res->status >= 400 && res->status < 500 && res->status != 408 && res->status != 429) throw UsageError(refusal);
  if (res->status >= 400) throw std::runtime_error(refusal);
  return reply;
}

int print_reply(const AdminArgs& args, const json& reply, const std::function<void(const json&)>& table) {
  if (table && !args.raw_json) {
    table(reply);
  } else {
    std::cout << reply.dump(2) << "\n";
  }
  return kExitCompleted;
}

}  // namespace yolo8::quota
