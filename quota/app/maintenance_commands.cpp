// quotad's maintenance commands: check a policy, hash a token, back up and repair a SQLite database, and render the
// Kubernetes quotas a policy implies.
#include <cstdio>
#include <memory>
#include <random>

#include "common/exit_codes.h"
#include "quota/app/command_table.h"
#include "quota/core/api.h"
#include "quota/core/sha256.h"
#include "quota/server/k8s_render.h"
#include "quota/store/store.h"

namespace yolo8::quota {
namespace {

struct CheckArgs {
  std::string policy = "configs/quota-policy.yaml";
  std::string memory_table;
};

int run_check_policy(const CheckArgs& args) {
  const auto describe = [](const MemoryTable& table) {
    std::string models;
    for (const auto& [model, estimate] : table.models) models += (models.empty() ? "" : ", ") + model;
    std::printf("memory table %s: ok: %zu models (%s); source %s%s%s\n", table.file.c_str(), table.models.size(),
                models.c_str(), table.source.empty() ? "unknown" : table.source.c_str(),
                table.provenance.device.empty() ? "" : ", measured on ",
                table.provenance.device.empty()
                    ? ""
                    : (table.provenance.device + ", " + table.provenance.precision + ", LibTorch " +
                       (table.provenance.libtorch.empty() ? "unknown" : table.provenance.libtorch) + ", " +
                       table.provenance.date)
                          .c_str());
    if (table.process_overhead_gib >= 0) {
      std::printf("  process_overhead_gib %.2f: the measured per-process GPU memory beyond the allocator's cap\n",
                  table.process_overhead_gib);
    }
  };
  if (args.policy.empty() && args.memory_table.empty()) {
    std::fprintf(stderr, "quotad check-policy: give a policy file or --memory-table FILE\n");
    return kExitBadInput;
  }
  if (!args.memory_table.empty()) describe(load_memory_table(args.memory_table));
  if (args.policy.empty()) return kExitCompleted;
  const Policy policy = load_policy_with_tokens(args.policy);
  std::printf("%s: ok: %d GPUs (%d reserved for critical leases), %zu teams, %zu users\n", args.policy.c_str(),
              policy.total_gpus(), policy.emergency_pool_gpus(), policy.teams.size(), policy.users.size());
  // what a trainer's $NODE_NAME and visible GPU UUIDs are matched against
  for (const auto& node : policy.nodes) {
    std::string uuids;
    for (const auto& uuid : node.uuids) uuids += (uuids.empty() ? "" : ", ") + uuid;
    std::printf("  node %s: %d GPUs of %g GiB; %s\n", node.name.c_str(), node.gpus, node.memory_gib,
                uuids.empty() ? "no GPU UUIDs (a trainer's visible GPUs are recorded, not matched)"
                              : ("UUIDs " + uuids).c_str());
  }
  if (!policy.memory_table.models.empty()) describe(policy.memory_table);
  // which overhead shared placement counts: the memory table's measured figure or the policy's default
  if (policy.sharing_enabled) {
    std::printf("  shared GPUs: each lease takes its share plus %s\n", policy.describe_shared_overhead().c_str());
  }
  return kExitCompleted;
}

struct HashArgs {
  std::string token;
  bool salted = false;
};

int run_hash_token(const HashArgs& args) {
  if (!args.salted) {
    std::printf("%s\n", sha256_hex(args.token).c_str());
    return kExitCompleted;
  }
  std::random_device random;  // the kernel's entropy
  std::string salt;
  char hex[3];
  for (int i = 0; i < 16; ++i) {
    std::snprintf(hex, sizeof(hex), "%02x", static_cast<unsigned>(random() & 0xff));
    salt += hex;
  }
  std::printf("{token_sha256: %s, token_salt: %s}\n", sha256_hex(salt + args.token).c_str(), salt.c_str());
  return kExitCompleted;
}

struct DatabaseArgs {
  std::string db = "quotad.db";
  int keep = 24;
};

int run_backup(const DatabaseArgs& args) {
  const std::string file = sqlite_only(
      args.db, "backup", "back it up with pg_dump, or continuous WAL archiving for point-in-time recovery (PITR)");
  std::printf("quotad backup: %s\n", backup_database(file, system_now_ms(), args.keep).c_str());
  return kExitCompleted;
}

int run_repair(const DatabaseArgs& args) {
  const std::string file = sqlite_only(args.db, "repair-db",
                                       "PostgreSQL keeps its pages whole itself; restore a pg_dump or a point in "
                                       "time (PITR), and move a row that does not parse to the table quarantine "
                                       "by hand");
  const RepairReport report = repair_database(file, system_now_ms());
  if (report.backup.empty()) {
    std::printf("quotad repair-db: %s was missing\n", file.c_str());
  } else {
    std::printf("quotad repair-db: copy kept as %s\n", report.backup.c_str());
  }
  if (!report.restored_from.empty()) std::printf("  restored from the backup %s\n", report.restored_from.c_str());
  for (const auto& line : report.salvaged) std::printf("  read from the damaged file: %s\n", line.c_str());
  for (const auto& row : report.quarantined) std::printf("  set aside in table quarantine: %s\n", row.c_str());
  for (int64_t seq : report.audit_gaps) {
    std::printf("  audit entry %lld was missing: recorded as audit.gap\n", static_cast<long long>(seq));
  }
  if (report.id_epoch > 0) {
    std::printf(
        "  ids continue at %lld (a new epoch: none handed out before the restore is reused); %s "
        "recorded as lost in one audit.gap entry\n",
        static_cast<long long>(report.id_epoch), report.lost_entries.c_str());
  }
  for (const auto& line : report.unrecorded) std::printf("  lost: %s\n", line.c_str());
  if (report.quarantined.empty() && report.audit_gaps.empty() && report.restored_from.empty() &&
      report.salvaged.empty() && report.unrecorded.empty()) {
    std::printf("  nothing to repair\n");
  }
  return kExitCompleted;
}

struct RenderArgs {
  std::string policy, out;
  double memory_per_gpu = 32;
};

int run_render(const RenderArgs& args) {
  K8sRenderOptions options;
  options.host_memory_gib_per_gpu = args.memory_per_gpu;
  const std::string text = render_k8s(load_policy(args.policy), options);
  write_output(args.out, text);
  if (!args.out.empty()) std::fprintf(stderr, "wrote %s\n", args.out.c_str());
  return kExitCompleted;
}

}  // namespace

void add_maintenance_commands(CLI::App& app, CommandTable& table) {
  auto check = std::make_shared<CheckArgs>();
  auto* check_cmd =
      app.add_subcommand("check-policy", "validate a policy file (and its memory table) and print a summary");
  check_cmd->add_option("policy", check->policy, "policy YAML");
  check_cmd->add_option("--memory-table", check->memory_table,
                        "validate a memory table on its own (the file `yolo8 profile` or `quotad memory-table` wrote)");
  table.add(check_cmd, [check] { return run_check_policy(*check); });

  auto hash = std::make_shared<HashArgs>();
  auto* hash_cmd = app.add_subcommand("hash-token", "print the SHA-256 of a token for the policy's users");
  hash_cmd->add_option("token", hash->token, "token")->required();
  hash_cmd->add_flag("--salt", hash->salted, "draw a random salt and print {token_sha256, token_salt}");
  table.add(hash_cmd, [hash] { return run_hash_token(*hash); });

  auto backup = std::make_shared<DatabaseArgs>();
  auto* backup_cmd = app.add_subcommand(
      "backup", "an online backup of the database now (quotad may keep serving): <db>.backup-<UTC time>");
  backup_cmd->add_option("--db", backup->db, "quotad's SQLite database")->capture_default_str();
  backup_cmd->add_option("--keep", backup->keep, "backups kept (the newest)")
      ->check(CLI::Range(1, 10000))
      ->capture_default_str();
  table.add(backup_cmd, [backup] { return run_backup(*backup); });

  auto repair = std::make_shared<DatabaseArgs>();
  auto* repair_cmd = app.add_subcommand(
      "repair-db", "with quotad stopped: keep a copy, set unparseable rows aside, record audit gaps");
  repair_cmd->add_option("--db", repair->db, "quotad's SQLite database")->capture_default_str();
  table.add(repair_cmd, [repair] { return run_repair(*repair); });

  auto render = std::make_shared<RenderArgs>();
  auto* render_cmd =
      app.add_subcommand("render-k8s", "write Namespaces, ResourceQuotas and LimitRanges from the policy");
  render_cmd->add_option("--policy", render->policy, "policy YAML")->required();
  render_cmd->add_option("--out", render->out, "write to this file instead of stdout");
  render_cmd->add_option("--memory-per-gpu", render->memory_per_gpu, "host memory (GiB) a GPU comes with")
      ->capture_default_str();
  table.add(render_cmd, [render] { return run_render(*render); });
}

}  // namespace yolo8::quota
