#include "quota/core/policy.h"

#include <gtest/gtest.h>

#include <fstream>

#include "quota/core/sha256.h"
#include "tests/quota/quota_test_util.h"

namespace yolo8::quota {
namespace {

using testing::kHour;
using testing::kMinute;
using testing::kMonday;

std::string minimal(const std::string& extra_team = "") {
  return "inventory:\n  nodes:\n    - {name: n1, gpus: 4, memory_gib: 24}\n"
         "users:\n  u: {token_sha256: " +
         std::string(64, 'a') +
         "}\n"
         "teams:\n  t:\n    base: 2\n    burst: 3\n    members: [u]\n" +
         extra_team;
}

std::string error_of(const std::string& yaml) {
  try {
    load_policy_from_string(yaml, "test.yaml");
  } catch (const PolicyError& e) {
    return e.what();
  }
  return "";
}

TEST(Policy, LoadsTheExampleDepartment) {
  const Policy p = testing::example_policy();
  EXPECT_EQ(p.total_gpus(), 20);
  EXPECT_EQ(p.emergency_pool_gpus(), 3);
  ASSERT_TRUE(p.teams.count("team-cv"));
  EXPECT_DOUBLE_EQ(p.teams.at("team-cv").base, 8);
  EXPECT_DOUBLE_EQ(p.teams.at("team-cv").burst, 14);
  EXPECT_DOUBLE_EQ(p.teams.at("team-robotics").burst, 6);
  EXPECT_EQ(p.users.at("carol").role, Role::kLead);
  EXPECT_EQ(p.users.at("carol").team, "team-cv");
  EXPECT_EQ(p.users.at("admin").role, Role::kAdmin);
  ASSERT_NE(p.find_user_by_token("alice-token"), nullptr);
  EXPECT_EQ(p.find_user_by_token("alice-token")->name, "alice");
  EXPECT_EQ(p.find_user_by_token("wrong"), nullptr);
  EXPECT_TRUE(p.memory_table.has("yolov8x"));
  EXPECT_FALSE(p.needs_approval("yolov8n"));
  EXPECT_TRUE(p.needs_approval("yolov8x"));
  EXPECT_TRUE(p.needs_approval("my-custom-net"));
}

TEST(Policy, BurstWindowInNamedOffset) {
  const Policy p = testing::example_policy();
  const Team& cv = p.teams.at("team-cv");
  // window is 09:00-12:00 at +01:00 = 08:00-11:00 UTC on weekdays
  EXPECT_FALSE(cv.in_burst_window(kMonday + 7 * kHour + 59 * kMinute));
  EXPECT_TRUE(cv.in_burst_window(kMonday + 8 * kHour));
  EXPECT_TRUE(cv.in_burst_window(kMonday + 10 * kHour + 59 * kMinute));
  EXPECT_FALSE(cv.in_burst_window(kMonday + 11 * kHour));
  EXPECT_FALSE(cv.in_burst_window(kMonday - 2 * 24 * kHour + 9 * kHour));  // Saturday
  EXPECT_DOUBLE_EQ(cv.limit_at(kMonday + 9 * kHour), 14);
  EXPECT_DOUBLE_EQ(cv.limit_at(kMonday + 13 * kHour), 8);
}

TEST(Policy, CivilTime) {
  EXPECT_EQ(weekday_of(kMonday), 0);
  EXPECT_EQ(weekday_of(kMonday - 1), 6);
  EXPECT_EQ(minute_of_day(kMonday + 9 * kHour + 30 * kMinute), 570);
  EXPECT_EQ(month_key(kMonday), "2026-11");
  EXPECT_EQ(month_key(kMonday + 24 * kHour), "2026-12");
  EXPECT_EQ(previous_month_key("2026-01"), "2025-12");
  EXPECT_EQ(parse_utc_offset_min("+05:30"), 330);
  EXPECT_EQ(parse_utc_offset_min("UTC-03:00"), -180);
  EXPECT_THROW(parse_utc_offset_min("Europe/Paris"), PolicyError);
}

TEST(Policy, MemoryTableEstimate) {
  const Policy p = testing::example_policy();
  // yolov8x: 5 + 0.85 * batch, activations scale with (imgsz / 640)^2
  EXPECT_NEAR(p.memory_table.estimate_gib("yolov8x", 640, 16), 5 + 0.85 * 16, 1e-9);
  EXPECT_NEAR(p.memory_table.estimate_gib("yolov8x", 1280, 16), 5 + 0.85 * 16 * 4, 1e-9);
  EXPECT_EQ(p.memory_table.max_batch("yolov8x", 640, 80), 88);
  EXPECT_EQ(p.memory_table.max_batch("yolov8x", 640, 4), 0);
}

// One schema for measured, observed and estimated tables: provenance is read and checked, file:line: key.
TEST(Policy, MemoryTableProvenanceIsReadAndChecked) {
  const std::string dir = ::testing::TempDir();
  const std::string path = dir + "/provenance-table.yaml";
  const auto load = [&](const std::string& text) {
    std::ofstream(path) << text;
    return load_memory_table(path);
  };
  const std::string head = "source: yolo8 profile\nreference_imgsz: 640\n";
  const std::string rows = "models:\n  yolov8n: {fixed_gib: 0.5, per_image_gib: 0.21}\n";
  const MemoryTable table = load(head +
                                 "provenance: {device: NVIDIA H200, precision: float32, libtorch: 2.1.2, "
                                 "date: \"2026-11-30\"}\n" +
                                 rows);
  EXPECT_EQ(table.provenance.device, "NVIDIA H200");
  EXPECT_EQ(table.provenance.precision, "float32");
  const std::string row = table.describe_row("yolov8n");
  EXPECT_NE(row.find(path + " row yolov8n: 0.500 GiB + 0.2100 GiB per image"), std::string::npos) << row;
  EXPECT_NE(row.find("yolo8 profile, NVIDIA H200, float32, LibTorch 2.1.2, 2026-11-30"), std::string::npos) << row;
  EXPECT_EQ(table.describe_row("yolov8q"), "");
  const auto error = [&](const std::string& text) {
    try {
      load(text);
    } catch (const PolicyError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  std::string e = error(head + "provenance: {precision: fp16}\n" + rows);
  EXPECT_NE(e.find(path + ":3: provenance.precision: must be amp, amp_bfloat16 or float32"), std::string::npos) << e;
  EXPECT_EQ(error(head + "provenance: {precision: amp_bfloat16}\n" + rows), "");  // yolo8 profile amp_dtype=bfloat16
  e = error(head + "provenance: {date: 30.11.2026}\n" + rows);
  EXPECT_NE(e.find(path + ":3: provenance.date"), std::string::npos) << e;
  e = error(head + "provenance: {gpu: x}\n" + rows);
  EXPECT_NE(e.find("provenance.gpu: unknown key"), std::string::npos) << e;
  e = error(head + "variants:\n  yolov8n: {fixed_gib: 0.5, per_image_gib: 0.21}\n");
  EXPECT_NE(e.find("variants: unknown key"), std::string::npos) << e;
}

TEST(Policy, ErrorsNameFileLineAndKey) {
  EXPECT_EQ(error_of(minimal()), "");
  std::string e = error_of(minimal() + "    bogus: 1\n");
  EXPECT_NE(e.find("test.yaml:"), std::string::npos) << e;
  EXPECT_NE(e.find("teams.t.bogus"), std::string::npos) << e;
  EXPECT_NE(e.find(":11:"), std::string::npos) << e;
  e = error_of(
      minimal("    burst_windows:\n      - {days: [mon], from: \"09:00\", to: \"10:00\", timezone: Europe/Paris}\n"));
  EXPECT_NE(e.find("timezone"), std::string::npos) << e;
  e = error_of(minimal("    burst_windows:\n      - {days: [moonday], from: \"09:00\", to: \"10:00\"}\n"));
  EXPECT_NE(e.find("weekday"), std::string::npos) << e;
  e = error_of(minimal("    burst_windows:\n      - {days: [mon], from: \"9h\", to: \"10:00\"}\n"));
  EXPECT_NE(e.find("HH:MM"), std::string::npos) << e;
  e = error_of(minimal() + "    leads: [nobody]\n");
  EXPECT_NE(e.find("unknown user 'nobody'"), std::string::npos) << e;
  e = error_of("inventory:\n  nodes: []\nteams: {}\n");
  EXPECT_NE(e.find("inventory.nodes"), std::string::npos) << e;
  e = error_of("");
  EXPECT_NE(e.find("(top level): must be a mapping"), std::string::npos) << e;
  e = error_of(minimal() + "    ? [a, b]\n    : 1\n");
  EXPECT_NE(e.find("test.yaml:"), std::string::npos) << e;
  e = error_of("inventory: [\n");
  EXPECT_NE(e.find("YAML syntax error"), std::string::npos) << e;
  e = error_of(minimal() + "leases: {ttl_s: ten}\n");
  EXPECT_NE(e.find("leases.ttl_s"), std::string::npos) << e;
  EXPECT_NE(e.find("wrong type"), std::string::npos) << e;
  e = error_of(
      "inventory:\n  nodes:\n    - {name: n1, gpus: 2, memory_gib: 24}\n"
      "teams:\n  t: {base: 3}\n");
  EXPECT_NE(e.find("teams.t.burst"), std::string::npos) << e;
}

// Each bad value below was once accepted; every error names the file, the line and the key.
TEST(PolicyValidation, NonFiniteNumbersAreRefused) {
  std::string e = error_of(minimal() + "emergency_pool: .nan\n");
  EXPECT_NE(e.find("test.yaml:11: emergency_pool"), std::string::npos) << e;
  EXPECT_NE(e.find("finite"), std::string::npos) << e;
  e = error_of(
      "inventory:\n  nodes:\n    - {name: n1, gpus: 4, memory_gib: 24}\n"
      "users:\n  u: {token_sha256: " +
      std::string(64, 'a') + "}\nteams:\n  t:\n    base: .nan\n    members: [u]\n");
  EXPECT_NE(e.find("test.yaml:8: teams.t.base"), std::string::npos) << e;
  e = error_of(minimal() + "credits: {monthly_gpu_hours: .inf}\n");
  EXPECT_NE(e.find(":11: credits.monthly_gpu_hours"), std::string::npos) << e;
  e = error_of(minimal() + "defaults: {memory_gib_other: -.inf}\n");
  EXPECT_NE(e.find(":11: defaults.memory_gib_other"), std::string::npos) << e;
}

// yaml-cpp reads "yes" in quotes as true: a quoted string where a switch belongs is refused with its line.
TEST(PolicyValidation, QuotedBooleansAreRefused) {
  std::string e = error_of(minimal() + "credits: {automatic_loan: \"yes\"}\n");
  EXPECT_NE(e.find("test.yaml:11: credits.automatic_loan: must be true or false, not a quoted string"),
            std::string::npos)
      << e;
  e = error_of(minimal() + "sharing: {enabled: 'true'}\n");
  EXPECT_NE(e.find(":11: sharing.enabled: must be true or false"), std::string::npos) << e;
  EXPECT_EQ(error_of(minimal() + "credits: {automatic_loan: false}\nsharing: {enabled: true}\n"), "");
}

TEST(PolicyValidation, RangesAreChecked) {
  std::string e = error_of(minimal() + "credits:\n  monthly_gpu_hours: -5\n");
  EXPECT_NE(e.find("test.yaml:12: credits.monthly_gpu_hours: must be >= 0"), std::string::npos) << e;
  e = error_of(minimal() + "credits:\n  loan_gpu_hours: -1\n");
  EXPECT_NE(e.find("test.yaml:12: credits.loan_gpu_hours"), std::string::npos) << e;
  e = error_of(minimal() + "limits:\n  max_batch: -1\n");
  EXPECT_NE(e.find("test.yaml:12: limits.max_batch: must be >= 1"), std::string::npos) << e;
  e = error_of(minimal() + "limits:\n  max_imgsz: 0\n");
  EXPECT_NE(e.find("test.yaml:12: limits.max_imgsz"), std::string::npos) << e;
  e = error_of(minimal() + "limits:\n  max_queued_per_user: 0\n");
  EXPECT_NE(e.find("test.yaml:12: limits.max_queued_per_user"), std::string::npos) << e;
  e = error_of(minimal() + "defaults:\n  memory_gib: {yolov8n: -4}\n");
  EXPECT_NE(e.find("test.yaml:12: defaults.memory_gib.yolov8n"), std::string::npos) << e;
  // a semantic error (validate) names its line too
  e = error_of(minimal() + "leases:\n  ttl_s: 10\n  heartbeat_interval_s: 20\n");
  EXPECT_NE(e.find("test.yaml:13: leases.heartbeat_interval_s"), std::string::npos) << e;
}

// The scheduling keys: fair_share.half_life_h, teams.<t>.share and teams.<t>.max_gpus_per_user.
TEST(PolicyValidation, SchedulingKeysAreReadAndChecked) {
  const Policy p = load_policy_from_string(
      minimal("    share: 3\n    max_gpus_per_user: 2\n") + "fair_share: {half_life_h: 168}\n", "test.yaml");
  EXPECT_DOUBLE_EQ(p.fair_share_half_life_h, 168);
  EXPECT_DOUBLE_EQ(p.teams.at("t").share_weight(), 3);
  EXPECT_EQ(p.teams.at("t").max_gpus_per_user, 2);
  EXPECT_DOUBLE_EQ(load_policy_from_string(minimal(), "test.yaml").teams.at("t").share_weight(), 2);  // the base
  std::string e = error_of(minimal() + "fair_share:\n  half_life_h: -1\n");
  EXPECT_NE(e.find("test.yaml:12: fair_share.half_life_h: must be >= 0"), std::string::npos) << e;
  e = error_of(minimal() + "fair_share:\n  half_life_h: .nan\n");
  EXPECT_NE(e.find("test.yaml:12: fair_share.half_life_h: must be a finite number"), std::string::npos) << e;
  e = error_of(minimal() + "fair_share:\n  decay: 3\n");
  EXPECT_NE(e.find("test.yaml:12: fair_share.decay: unknown key"), std::string::npos) << e;
  e = error_of(minimal("    share: -2\n"));
  EXPECT_NE(e.find("test.yaml:11: teams.t.share: must be >= 0"), std::string::npos) << e;
  e = error_of(minimal("    max_gpus_per_user: -1\n"));
  EXPECT_NE(e.find("test.yaml:11: teams.t.max_gpus_per_user: must be >= 0"), std::string::npos) << e;
  e = error_of(minimal("    max_gpus_per_user: 9\n"));
  EXPECT_NE(e.find("test.yaml:11: teams.t.max_gpus_per_user: exceeds the inventory"), std::string::npos) << e;
}

TEST(PolicyValidation, DuplicateKeysNameBothLines) {
  std::string e = error_of(minimal() + "  t:\n    base: 1\n");
  EXPECT_NE(e.find("test.yaml:11: teams.t: duplicate key (lines 7 and 11)"), std::string::npos) << e;
  e = error_of(
      "inventory:\n  nodes:\n    - {name: n1, gpus: 4, memory_gib: 24}\n"
      "users:\n  u: {token_sha256: " +
      std::string(64, 'a') + "}\n  u: {token_sha256: " + std::string(64, 'b') +
      "}\nteams:\n  t: {base: 1, members: [u]}\n");
  EXPECT_NE(e.find("test.yaml:6: users.u: duplicate key (lines 5 and 6)"), std::string::npos) << e;
  e = error_of(minimal() + "leases: {ttl_s: 60, ttl_s: 30}\n");
  EXPECT_NE(e.find("leases.ttl_s: duplicate key"), std::string::npos) << e;
}

TEST(PolicyValidation, TokenHashesAreHex) {
  const std::string not_hex = std::string(63, 'a') + "g";
  std::string e = error_of(
      "inventory:\n  nodes:\n    - {name: n1, gpus: 4, memory_gib: 24}\n"
      "users:\n  u: {token_sha256: " +
      not_hex + "}\nteams:\n  t: {base: 1, members: [u]}\n");
  EXPECT_NE(e.find("test.yaml:5: users.u.token_sha256: must be 64 hex digits"), std::string::npos) << e;
  e = error_of(
      "inventory:\n  nodes:\n    - {name: n1, gpus: 4, memory_gib: 24}\n"
      "users:\n  u: {token_sha256: " +
      std::string(64, 'a') + ", token_salt: xyz}\nteams:\n  t: {base: 1, members: [u]}\n");
  EXPECT_NE(e.find("users.u.token_salt: must be hex digits"), std::string::npos) << e;
}

TEST(PolicyValidation, TeamAndUserNamesAreKubernetesSafe) {
  auto policy_with = [](const std::string& team, const std::string& user) {
    return "inventory:\n  nodes:\n    - {name: n1, gpus: 4, memory_gib: 24}\n"
           "users:\n  " +
           user + ": {token_sha256: " + std::string(64, 'a') + "}\nteams:\n  " + team +
           ":\n    base: 1\n    members: [" + user + "]\n";
  };
  EXPECT_EQ(error_of(policy_with("team-cv", "j.doe_2")), "");
  std::string e = error_of(policy_with("Team_Interns", "u"));
  EXPECT_NE(e.find("test.yaml:7: teams.Team_Interns: 'Team_Interns' is not a valid team name"), std::string::npos) << e;
  EXPECT_NE(error_of(policy_with("-cv", "u")).find("not a valid team name"), std::string::npos);
  EXPECT_NE(error_of(policy_with(std::string(64, 'a'), "u")).find("not a valid team name"), std::string::npos);
  e = error_of(policy_with("t", "Alice"));
  EXPECT_NE(e.find("test.yaml:5: users.Alice: 'Alice' is not a valid user name"), std::string::npos) << e;
  EXPECT_NE(error_of(policy_with("t", "a b")).find("not a valid user name"), std::string::npos);
}

TEST(PolicyValidation, SaltedTokensAreFoundAndCompared) {
  const std::string salt = "00ff11ee";
  const std::string yaml =
      "inventory:\n  nodes:\n    - {name: n1, gpus: 4, memory_gib: 24}\n"
      "users:\n  u: {token_sha256: " +
      sha256_hex(salt + "s3cret") + ", token_salt: " + salt + "}\n  v: {token_sha256: " + sha256_hex("plain") +
      "}\nteams:\n  t: {base: 1, members: [u, v]}\n";
  const Policy p = load_policy_from_string(yaml, "test.yaml");
  ASSERT_NE(p.find_user_by_token("s3cret"), nullptr);
  EXPECT_EQ(p.find_user_by_token("s3cret")->name, "u");
  EXPECT_EQ(p.find_user_by_token(sha256_hex(salt + "s3cret")), nullptr);
  ASSERT_NE(p.find_user_by_token("plain"), nullptr);
  EXPECT_EQ(p.find_user_by_token("plain")->name, "v");
  EXPECT_EQ(p.find_user_by_token("s3cret2"), nullptr);
}

// Token rotation: the previous token authenticates beside the new one until its `until` (or a reload drops it).
TEST(PolicyValidation, APreviousTokenOverlapsUntilItsEnd) {
  const std::string head =
      "inventory:\n  nodes:\n    - {name: n1, gpus: 4, memory_gib: 24}\nteams:\n  t: {base: 1, members: [u]}\n"
      "users:\n  u: {token_sha256: " +
      sha256_hex("new") + ", previous_token_sha256: " + sha256_hex("old");
  const Policy open_ended = load_policy_from_string(head + "}\n", "test.yaml");
  ASSERT_NE(open_ended.find_user_by_token("old", 0), nullptr);
  EXPECT_EQ(open_ended.find_user_by_token("old", 0)->name, "u");
  EXPECT_NE(open_ended.find_user_by_token("new", 0), nullptr);
  EXPECT_NE(open_ended.find_user_by_token("old"), nullptr);  // no end: no time needed
  EXPECT_EQ(open_ended.find_user_by_token("other", 0), nullptr);

  const Policy until = load_policy_from_string(head + ", previous_token_until: '2026-12-31T18:00:00Z'}\n", "test.yaml");
  const int64_t end_ms = 1798740000000;  // 2026-12-31T18:00:00Z
  EXPECT_EQ(until.users.at("u").previous_token_until_ms, end_ms);
  EXPECT_NE(until.find_user_by_token("old", end_ms - 1), nullptr);
  EXPECT_EQ(until.find_user_by_token("old", end_ms), nullptr);
  EXPECT_EQ(until.find_user_by_token("old"), nullptr);  // without a time its end cannot be checked
  EXPECT_NE(until.find_user_by_token("new", end_ms), nullptr);

  auto error = [&](const std::string& yaml) {
    try {
      load_policy_from_string(yaml, "test.yaml");
    } catch (const PolicyError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(error(head + ", previous_token_until: tomorrow}\n").find("users.u.previous_token_until"),
            std::string::npos);
  const std::string same =
      "inventory:\n  nodes:\n    - {name: n1, gpus: 4, memory_gib: 24}\nteams:\n  t: {base: 1, members: [u]}\n"
      "users:\n  u: {token_sha256: " +
      sha256_hex("new") + ", previous_token_sha256: " + sha256_hex("new") + "}\n";
  EXPECT_NE(error(same).find("users.u.previous_token_sha256: the same token as token_sha256"), std::string::npos)
      << error(same);
  EXPECT_NE(error(head.substr(0, head.size() - 64) + "xyz}\n").find("users.u.previous_token_sha256: must be 64 hex"),
            std::string::npos);
}

TEST(PolicyReload, TheSummaryNamesWhatChangedAndTheRefusalWhatNeedsARestart) {
  const Policy before = testing::example_policy();
  Policy after = before;
  after.teams.at("team-cv").base = 5;
  after.users.at("alice").token_sha256 = sha256_hex("rotated");
  after.users.erase("ivan");
  const std::string summary = policy_change_summary(before, after);
  EXPECT_NE(summary.find("team team-cv: base 8 -> 5"), std::string::npos) << summary;
  EXPECT_NE(summary.find("user alice: token replaced"), std::string::npos) << summary;
  EXPECT_NE(summary.find("user ivan removed"), std::string::npos) << summary;
  EXPECT_EQ(summary.find(sha256_hex("rotated")), std::string::npos) << "no hash in the audit log";
  EXPECT_EQ(policy_change_summary(before, before), "");
  EXPECT_EQ(reload_refusal(before, after), "");
  Policy fewer_gpus = before;
  fewer_gpus.gpus.pop_back();
  EXPECT_NE(reload_refusal(before, fewer_gpus).find("inventory: changed"), std::string::npos);
  Policy waste = before;
  waste.waste_after_s += 60;
  EXPECT_NE(reload_refusal(before, waste).find("waste: changed"), std::string::npos);
}

// The deployment mounts the token hashes as a Secret and names it in QUOTAD_TOKENS_FILE.
TEST(PolicyValidation, TokenHashesComeFromTheTokensFile) {
  const std::string policy =
      "inventory:\n  nodes:\n    - {name: n1, gpus: 4, memory_gib: 24}\n"
      "users:\n  u: {}\n  v: {token_sha256: " +
      sha256_hex("old") + "}\nteams:\n  t: {base: 1, members: [u, v]}\n";
  const std::string tokens = "users:\n  u: {token_sha256: " + sha256_hex("ab" + std::string("u-secret")) +
                             ", token_salt: ab}\n  v: {token_sha256: " + sha256_hex("v-secret") + "}\n";
  const Policy p = load_policy_from_string(policy, "policy.yaml", ".", tokens, "tokens.yaml");
  ASSERT_NE(p.find_user_by_token("u-secret"), nullptr);
  EXPECT_EQ(p.find_user_by_token("u-secret")->name, "u");
  ASSERT_NE(p.find_user_by_token("v-secret"), nullptr);
  EXPECT_EQ(p.find_user_by_token("old"), nullptr) << "the Secret's hash replaces the policy's";
  auto error = [&](const std::string& tokens_yaml) {
    try {
      load_policy_from_string(policy, "policy.yaml", ".", tokens_yaml, "tokens.yaml");
    } catch (const PolicyError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(
      error("users:\n  u: {token_sha256: " + sha256_hex("x") + "}\n  zed: {token_sha256: " + sha256_hex("y") + "}\n")
          .find("tokens.yaml:3: users.zed: not a user of the policy"),
      std::string::npos);
  EXPECT_NE(error("users:\n  v: {token_sha256: " + sha256_hex("y") + "}\n")
                .find("policy.yaml:5: users.u.token_sha256: no token hash"),
            std::string::npos)
      << error("users:\n  v: {token_sha256: " + sha256_hex("y") + "}\n");
  EXPECT_NE(error("users:\n  u: {token_sha256: nothex}\n").find("tokens.yaml:2: users.u.token_sha256"),
            std::string::npos);
}

// Inventory nodes may list their GPUs' UUIDs (nvidia-smi -L), one per GPU in index order; quotad matches the
// GPUs a trainer sees against them.
TEST(PolicyValidation, GpuUuidsAreOnePerGpuUniqueAndWellFormed) {
  const std::string uuid_a = "GPU-5b1a3c7e-0d2f-4e61-9a8b-1c2d3e4f5a60";
  const std::string uuid_b = "GPU-5b1a3c7e-0d2f-4e61-9a8b-1c2d3e4f5a61";
  const std::string mig = "MIG-4f1c2a3b-5d6e-5f70-8a9b-0c1d2e3f4a5b";
  const std::string old_mig = "MIG-GPU-5b1a3c7e-0d2f-4e61-9a8b-1c2d3e4f5a62/1/0";
  auto policy = [&](const std::string& second_node) {
    return "inventory:\n  nodes:\n    - {name: n1, gpus: 2, memory_gib: 24, uuids: [" + uuid_a + ", " + uuid_b +
           "]}\n" + second_node + "users:\n  u: {token_sha256: " + std::string(64, 'a') +
           "}\nteams:\n  t:\n    base: 2\n    members: [u]\n";
  };
  const Policy p =
      load_policy_from_string(policy("    - {name: n2, gpus: 2, memory_gib: 80, uuids: [" + mig + ", " + old_mig +
                                     "]}\n"
                                     "    - {name: n3, gpus: 1, memory_gib: 80}\n"),
                              "test.yaml");
  ASSERT_EQ(p.total_gpus(), 5);
  EXPECT_EQ(p.gpus[0].uuid, uuid_a);
  EXPECT_EQ(p.gpus[1].uuid, uuid_b);
  EXPECT_EQ(p.gpus[2].uuid, mig);
  EXPECT_EQ(p.gpus[3].uuid, old_mig);
  EXPECT_EQ(p.gpus[4].uuid, "") << "a node may list none";
  EXPECT_TRUE(p.has_gpu_uuids());
  EXPECT_EQ(p.node_names(), (std::vector<std::string>{"n1", "n2", "n3"}));
  EXPECT_FALSE(load_policy_from_string(minimal(), "test.yaml").has_gpu_uuids());

  std::string e = error_of(policy("    - {name: n2, gpus: 2, memory_gib: 80, uuids: [" + mig + "]}\n"));
  EXPECT_NE(e.find("test.yaml:4: inventory.nodes[1].uuids: lists 1 UUIDs for the 2 GPUs of node n2"), std::string::npos)
      << e;
  e = error_of(policy("    - name: n2\n      gpus: 2\n      memory_gib: 80\n      uuids:\n        - " + mig +
                      "\n        - GPU-1234\n"));
  EXPECT_NE(e.find("test.yaml:9: inventory.nodes[1].uuids[1]: 'GPU-1234' is not a GPU UUID"), std::string::npos) << e;
  e = error_of(policy("    - {name: n2, gpus: 2, memory_gib: 80, uuids: [" + mig + ", " + uuid_a + "]}\n"));
  EXPECT_NE(e.find("inventory.nodes[1].uuids[1]: '" + uuid_a + "' is listed twice (also inventory.nodes[0].uuids[0])"),
            std::string::npos)
      << e;
  // the same UUID in another case is the same GPU
  std::string upper = uuid_b;
  for (char& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  e = error_of(policy("    - {name: n2, gpus: 1, memory_gib: 80, uuids: [" + upper + "]}\n"));
  EXPECT_NE(e.find("is listed twice"), std::string::npos) << e;
  e = error_of(policy("    - {name: n2, gpus: 1, memory_gib: 80, uuids: 3}\n"));
  EXPECT_NE(e.find("inventory.nodes[1].uuids: must be a list"), std::string::npos) << e;

  EXPECT_TRUE(is_gpu_uuid(uuid_a));
  EXPECT_TRUE(is_gpu_uuid(mig));
  EXPECT_TRUE(is_gpu_uuid(old_mig));
  EXPECT_FALSE(is_gpu_uuid("0"));
  EXPECT_FALSE(is_gpu_uuid("GPU-5b1a3c7e-0d2f-4e61-9a8b-1c2d3e4f5a6"));
  EXPECT_FALSE(is_gpu_uuid("GPU-5b1a3c7e-0d2f-4e61-9a8b-1c2d3e4f5a60x"));
  EXPECT_FALSE(is_gpu_uuid("MIG-GPU-5b1a3c7e-0d2f-4e61-9a8b-1c2d3e4f5a62/1"));
}

// The example policy limits shared leases to the small models.
TEST(Policy, ExampleSharesGpusOnlyForSmallModels) {
  const Policy p = testing::example_policy();
  EXPECT_EQ(p.shared_models, (std::vector<std::string>{"yolov8n", "yolov8s"}));
  EXPECT_EQ(p.shared_refusal("yolov8n", 1), "");
  EXPECT_NE(p.shared_refusal("yolov8m", 1).find("sharing.models"), std::string::npos);
  for (const auto& model : p.shared_models) EXPECT_TRUE(p.memory_table.has(model)) << model;
}

// The privileged channel is sized by policy; absent it is the emergency pool (a member's emergency
// takes no more than the pool would have held), and a bad value names the file, line and key.
TEST(Policy, EmergencyMaxGpusPerRequestDefaultsToThePoolAndIsChecked) {
  Policy absent = load_policy_from_string(minimal() + "emergency_pool: 0.25\n", "test.yaml");
  EXPECT_EQ(absent.emergency_pool_gpus(), 1);
  EXPECT_EQ(absent.critical_gpus_cap(), 1);
  Policy set = load_policy_from_string(minimal() + "emergency: {max_gpus_per_request: 3}\n", "test.yaml");
  EXPECT_EQ(set.critical_gpus_cap(), 3);
  EXPECT_EQ(testing::example_policy().critical_gpus_cap(), 8);  // configs/quota-policy.yaml, the demo's job
  std::string e = error_of(minimal() + "emergency: {max_gpus_per_request: -1}\n");
  EXPECT_NE(e.find("test.yaml:"), std::string::npos) << e;
  EXPECT_NE(e.find("emergency.max_gpus_per_request: must be >= 0"), std::string::npos) << e;
  e = error_of(minimal() + "emergency: {max_gpus_per_request: 5}\n");
  EXPECT_NE(e.find("emergency.max_gpus_per_request: must be within 0..4"), std::string::npos) << e;
  e = error_of(minimal() + "emergency: {max_gpus: 2}\n");
  EXPECT_NE(e.find("emergency.max_gpus: unknown key"), std::string::npos) << e;
  // one workstation (local mode) has no pool: its user may still take every GPU
  EXPECT_EQ(local_policy(2, 16, "me").critical_gpus_cap(), 2);
}

// sharing.process_overhead_gib: what each process on a shared GPU holds beyond its share; 0.75 GiB until
// measured, and a memory table's measured process_overhead_gib overrides it. Bad values name the key.
TEST(PolicyValidation, TheProcessOverheadOfSharedLeasesIsReadCheckedAndOverriddenByTheMemoryTable) {
  const Policy fallback = load_policy_from_string(minimal(), "test.yaml");
  EXPECT_DOUBLE_EQ(fallback.process_overhead_gib, 0.75);
  EXPECT_DOUBLE_EQ(fallback.shared_overhead_gib(), 0.75);
  EXPECT_EQ(fallback.describe_shared_overhead(),
            "0.75 GiB per process (sharing.process_overhead_gib, a default until measured on the GPU)");
  const Policy set =
      load_policy_from_string(minimal() + "sharing: {enabled: true, process_overhead_gib: 1.5}\n", "test.yaml");
  EXPECT_DOUBLE_EQ(set.shared_overhead_gib(), 1.5);
  EXPECT_EQ(set.describe_shared_overhead(), "1.50 GiB per process (sharing.process_overhead_gib)");
  std::string e = error_of(minimal() + "sharing:\n  process_overhead_gib: -0.5\n");
  EXPECT_NE(e.find("test.yaml:12: sharing.process_overhead_gib: must be >= 0"), std::string::npos) << e;
  e = error_of(minimal() + "sharing:\n  process_overhead_gib: .nan\n");
  EXPECT_NE(e.find("test.yaml:12: sharing.process_overhead_gib: must be a finite number"), std::string::npos) << e;
  e = error_of(minimal() + "sharing:\n  process_overhead_gib: lots\n");
  EXPECT_NE(e.find("test.yaml:12: sharing.process_overhead_gib: has the wrong type"), std::string::npos) << e;

  // the table `yolo8 profile` measured on the GPU: its figure is the one placement counts
  const std::string table_path = ::testing::TempDir() + "/overhead-table.yaml";
  const std::string rows = "models:\n  yolov8n: {fixed_gib: 0.5, per_image_gib: 0.21}\n";
  std::ofstream(table_path) << "source: yolo8 profile\nprovenance: {device: NVIDIA H200, date: \"2026-12-01\"}\n"
                               "process_overhead_gib: 0.62\n" +
                                   rows;
  const Policy measured = load_policy_from_string(
      minimal() + "sharing: {enabled: true, process_overhead_gib: 1.5}\n" + "memory_table: " + table_path + "\n",
      "test.yaml");
  EXPECT_DOUBLE_EQ(measured.memory_table.process_overhead_gib, 0.62);
  EXPECT_DOUBLE_EQ(measured.shared_overhead_gib(), 0.62);
  EXPECT_EQ(measured.describe_shared_overhead(), "0.62 GiB per process (measured: memory table " + table_path +
                                                     " process_overhead_gib, yolo8 profile, NVIDIA H200, 2026-12-01)");
  // a table without the key leaves the policy's figure in force
  std::ofstream(table_path) << rows;
  EXPECT_DOUBLE_EQ(load_memory_table(table_path).process_overhead_gib, -1);
  EXPECT_DOUBLE_EQ(
      load_policy_from_string(minimal() + "memory_table: " + table_path + "\n", "test.yaml").shared_overhead_gib(),
      0.75);
  const auto table_error = [&](const std::string& text) {
    std::ofstream(table_path) << text;
    try {
      load_memory_table(table_path);
    } catch (const PolicyError& error) {
      return std::string(error.what());
    }
    return std::string();
  };
  e = table_error("process_overhead_gib: -1\n" + rows);
  EXPECT_NE(e.find(table_path + ":1: process_overhead_gib: must be >= 0"), std::string::npos) << e;
  e = table_error("process_overhead_gib: .inf\n" + rows);
  EXPECT_NE(e.find(table_path + ":1: process_overhead_gib: must be a finite number"), std::string::npos) << e;
  // a policy built in code is checked by validate(), naming the key
  Policy coded = fallback;
  coded.process_overhead_gib = -1;
  try {
    coded.validate();
    ADD_FAILURE() << "no PolicyError";
  } catch (const PolicyError& error) {
    EXPECT_NE(std::string(error.what()).find("sharing.process_overhead_gib: must be >= 0"), std::string::npos)
        << error.what();
  }
  coded = fallback;
  coded.memory_table.process_overhead_gib = -2;
  EXPECT_THROW(coded.validate(), PolicyError);
}

}  // namespace
}  // namespace yolo8::quota
