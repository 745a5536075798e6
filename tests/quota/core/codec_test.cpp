#include "quota/core/codec.h"

#include <gtest/gtest.h>

#include "tests/quota/quota_test_util.h"

namespace yolo8::quota {
namespace {

using nlohmann::json;

// The message of the PolicyError `action` throws; empty (and a test failure) when it throws none.
template <typename Action>
std::string policy_error_of(Action action) {
  try {
    action();
  } catch (const PolicyError& error) {
    return error.what();
  }
  ADD_FAILURE() << "no PolicyError";
  return "";
}

// The heartbeat says where its utilisation comes from: the devices (NVML) or the time spent in steps.
TEST(QuotaCodec, TelemetryCarriesItsUtilisationSource) {
  const Telemetry nvml =
      telemetry_from_json(json{{"gpu_util", 0.4}, {"gpu_util_source", "nvml"}, {"device_memory_used_gib", 3.5}});
  EXPECT_EQ(nvml.gpu_util_source, "nvml");
  EXPECT_DOUBLE_EQ(nvml.device_memory_used_gib, 3.5);
  const Telemetry again = telemetry_from_json(to_json(nvml));
  EXPECT_EQ(again.gpu_util_source, "nvml");
  EXPECT_DOUBLE_EQ(again.device_memory_used_gib, 3.5);
  EXPECT_EQ(telemetry_from_json(json{{"gpu_util", 0.1}, {"gpu_util_source", "busy_time"}}).gpu_util_source,
            "busy_time");
  // An older trainer says nothing: unknown, not an error.
  const Telemetry old = telemetry_from_json(json{{"gpu_util", 0.1}});
  EXPECT_EQ(old.gpu_util_source, "");
  EXPECT_LT(old.device_memory_used_gib, 0);
  EXPECT_FALSE(to_json(old).contains("gpu_util_source"));
  try {
    telemetry_from_json(json{{"gpu_util", 0.1}, {"gpu_util_source", "guess"}});
    ADD_FAILURE() << "no RequestError";
  } catch (const RequestError& error) {
    EXPECT_NE(std::string(error.what()).find("gpu_util_source"), std::string::npos) << error.what();
  }
}

// What the trainer reports about its devices and its memory peak survives the wire and storage; bad forms are
// refused naming the field.
TEST(QuotaCodec, VisibleDevicesAndMemoryContextRoundTrip) {
  const LeaseRequest request = lease_request_from_json(
      json{{"model", "yolov8n"}, {"node", "gpu-node"}, {"visible_devices", {"GPU-1", "GPU-2"}}});
  EXPECT_EQ(request.node, "gpu-node");
  EXPECT_EQ(request.visible_devices, (std::vector<std::string>{"GPU-1", "GPU-2"}));
  const json stored = to_json(request);
  EXPECT_EQ(stored["visible_devices"], json({"GPU-1", "GPU-2"}));
  EXPECT_THROW(lease_request_from_json(json{{"visible_devices", "GPU-1"}}), RequestError);
  EXPECT_THROW(lease_request_from_json(json{{"visible_devices", {1}}}), RequestError);
  const LeaseRequest asked = lease_request_from_json(json{{"node", "gpu-node"}, {"node_gpus", {2, 3}}});
  EXPECT_EQ(asked.node_gpus, (std::vector<int>{2, 3}));
  EXPECT_EQ(to_json(asked)["node_gpus"], json({2, 3}));
  EXPECT_THROW(lease_request_from_json(json{{"node_gpus", {-1}}}), RequestError);
  EXPECT_THROW(lease_request_from_json(json{{"node_gpus", {"2"}}}), RequestError);
  const Telemetry beat = telemetry_from_json(json{{"memory_used_gib", 2.5},
                                                  {"model", "yolov8n"},
                                                  {"imgsz", 640},
                                                  {"batch", 16},
                                                  {"amp", true},
                                                  {"device_name", "NVIDIA L4"}});
  EXPECT_TRUE(beat.is_memory_observation());
  EXPECT_EQ(beat.amp, 1);
  EXPECT_EQ(telemetry_from_json(to_json(beat)).device_name, "NVIDIA L4");
  EXPECT_FALSE(telemetry_from_json(json{{"memory_used_gib", 2.5}}).is_memory_observation());
  EXPECT_THROW(telemetry_from_json(json{{"amp", "yes"}}), RequestError);
}

// The LibTorch version a peak was measured with (the learned table's provenance) is optional: an older trainer
// sends none, and the field is then left out.
TEST(QuotaCodec, TelemetryCarriesTheLibtorchVersionWhenGiven) {
  const Telemetry beat = telemetry_from_json(json{{"memory_used_gib", 2.5}, {"libtorch", "2.1.2"}});
  EXPECT_EQ(beat.libtorch, "2.1.2");
  EXPECT_EQ(to_json(beat)["libtorch"], "2.1.2");
  EXPECT_EQ(telemetry_from_json(to_json(beat)).libtorch, "2.1.2");
  const Telemetry old = telemetry_from_json(json{{"memory_used_gib", 2.5}});
  EXPECT_EQ(old.libtorch, "");
  EXPECT_FALSE(to_json(old).contains("libtorch"));
  EXPECT_THROW(telemetry_from_json(json{{"libtorch", std::string(100, '9')}}), RequestError);
  Telemetry merged;
  merge_memory_context(merged, beat);
  EXPECT_EQ(merged.libtorch, "2.1.2");
  merge_memory_context(merged, old);  // a report without it keeps what the lease said before
  EXPECT_EQ(merged.libtorch, "2.1.2");
}

// A stored lease keeps what its peak was measured with: before, a restart (or `quotad report`, which reads the
// records) saw the peak without its model, image size, batch, AMP, device and LibTorch.
TEST(QuotaCodec, ALeaseRecordKeepsItsTelemetrysMemoryContext) {
  Lease lease;
  lease.id = 3;
  lease.state = LeaseState::kGranted;
  lease.telemetry = telemetry_from_json(json{{"memory_used_gib", 12.0},
                                             {"model", "yolov8s"},
                                             {"imgsz", 640},
                                             {"batch", 16},
                                             {"amp", false},
                                             {"device_name", "NVIDIA H200"},
                                             {"libtorch", "2.11.0"}});
  const Lease back = lease_from_json(to_json(lease, Policy{}));
  EXPECT_EQ(back.telemetry.memory_used_gib, 12.0);
  EXPECT_EQ(back.telemetry.model, "yolov8s");
  EXPECT_EQ(back.telemetry.imgsz, 640);
  EXPECT_EQ(back.telemetry.batch, 16);
  EXPECT_EQ(back.telemetry.amp, 0);
  EXPECT_EQ(back.telemetry.device_name, "NVIDIA H200");
  EXPECT_EQ(back.telemetry.libtorch, "2.11.0");
  EXPECT_TRUE(back.telemetry.is_memory_observation());
}

// The heartbeat clock quotad moved (outage credit, restart) is kept apart from the last sign of life, which
// billing goes by; a row of an older quotad has none and counts from its last sign of life.
TEST(QuotaCodec, ALeaseRecordKeepsItsHeartbeatClockApartFromItsLastSignOfLife) {
  Lease lease;
  lease.id = 4;
  lease.state = LeaseState::kGranted;
  lease.last_seen_ms = 1000;
  lease.heartbeat_clock_ms = 41000;
  lease.charged_until_ms = 11000;
  const json row = to_json(lease, Policy{});
  const Lease back = lease_from_json(row);
  EXPECT_EQ(back.last_seen_ms, 1000);
  EXPECT_EQ(back.heartbeat_clock_ms, 41000);
  EXPECT_EQ(back.charged_until_ms, 11000);
  json old = row;
  old.erase("heartbeat_clock_ms");
  EXPECT_EQ(lease_from_json(old).heartbeat_clock_ms, 0);
  EXPECT_EQ(lease_from_json(old).last_seen_ms, 1000);
}

// On a shared GPU the device's memory is every lease's sum: the heartbeat also carries the trainer's own
// process's (NVML per PID), through the wire, the lease record and the merge of later heartbeats.
TEST(QuotaCodec, TelemetryCarriesTheProcesssOwnGpuMemory) {
  const Telemetry beat = telemetry_from_json(json{{"device_memory_used_gib", 30.5}, {"process_memory_used_gib", 7.25}});
  EXPECT_DOUBLE_EQ(beat.process_memory_used_gib, 7.25);
  EXPECT_DOUBLE_EQ(telemetry_from_json(to_json(beat)).process_memory_used_gib, 7.25);
  Lease lease;
  lease.id = 4;
  lease.state = LeaseState::kGranted;
  lease.telemetry = beat;
  const Lease back = lease_from_json(to_json(lease, Policy{}));
  EXPECT_DOUBLE_EQ(back.telemetry.process_memory_used_gib, 7.25);
  EXPECT_DOUBLE_EQ(back.telemetry.device_memory_used_gib, 30.5);
  // an older trainer (or one without NVML) says nothing: unknown, and left out again
  const Telemetry old = telemetry_from_json(json{{"device_memory_used_gib", 30.5}});
  EXPECT_DOUBLE_EQ(old.process_memory_used_gib, -1);
  EXPECT_FALSE(to_json(old).contains("process_memory_used_gib"));
  EXPECT_DOUBLE_EQ(
      lease_from_json(
          json{{"id", 5}, {"request", json::object()}, {"state", "granted"}, {"telemetry", {{"gpu_util", 0.5}}}})
          .telemetry.process_memory_used_gib,
      -1);
  // a heartbeat without the figure keeps the last one reported
  Telemetry merged = beat;
  merge_telemetry(merged, old);
  EXPECT_DOUBLE_EQ(merged.process_memory_used_gib, 7.25);
  Telemetry newer;
  newer.process_memory_used_gib = 8;
  merge_telemetry(merged, newer);
  EXPECT_DOUBLE_EQ(merged.process_memory_used_gib, 8);
}

TEST(QuotaCodec, EveryLeaseStateRoundTripsThroughItsText) {
  const std::vector<std::pair<LeaseState, std::string>> states = {{LeaseState::kPendingApproval, "pending_approval"},
                                                                  {LeaseState::kQueued, "queued"},
                                                                  {LeaseState::kGranted, "granted"},
                                                                  {LeaseState::kRevoking, "revoking"},
                                                                  {LeaseState::kReleased, "released"},
                                                                  {LeaseState::kExpired, "expired"},
                                                                  {LeaseState::kRejected, "rejected"}};
  for (const auto& [state, text] : states) {
    EXPECT_EQ(to_string(state), text);
    EXPECT_EQ(parse_lease_state(text), state) << text;
  }
}

TEST(QuotaCodec, EveryOutcomeRoundTripsThroughItsText) {
  const std::vector<std::pair<Outcome, std::string>> outcomes = {{Outcome::kNone, ""},
                                                                 {Outcome::kCompleted, "completed"},
                                                                 {Outcome::kPreempted, "preempted"},
                                                                 {Outcome::kFailed, "failed"},
                                                                 {Outcome::kCancelled, "cancelled"}};
  for (const auto& [outcome, text] : outcomes) {
    EXPECT_EQ(to_string(outcome), text);
    EXPECT_EQ(parse_outcome(text), outcome) << text;
  }
}

TEST(QuotaCodec, EveryApprovalStateRoundTripsThroughItsText) {
  const std::vector<std::pair<ApprovalState, std::string>> states = {{ApprovalState::kPending, "pending"},
                                                                     {ApprovalState::kApproved, "approved"},
                                                                     {ApprovalState::kRejected, "rejected"},
                                                                     {ApprovalState::kCancelled, "cancelled"}};
  for (const auto& [state, text] : states) {
    EXPECT_EQ(to_string(state), text);
    EXPECT_EQ(parse_approval_state(text), state) << text;
  }
}

TEST(QuotaCodec, AcquireKindsKeepTheirApiStatusTexts) {
  using Kind = AcquireResult::Kind;
  EXPECT_EQ(to_string(Kind::kGranted), "granted");
  EXPECT_EQ(to_string(Kind::kQueued), "queued");
  EXPECT_EQ(to_string(Kind::kNeedsApproval), "needs_approval");
  EXPECT_EQ(to_string(Kind::kNotAllowed), "not_allowed");
  EXPECT_EQ(to_string(Kind::kAdmissionRefused), "refused");
  EXPECT_EQ(to_string(Kind::kCreditsSpent), "credits_spent");
  EXPECT_EQ(to_string(Kind::kInvalid), "invalid");
}

TEST(QuotaCodec, UnknownTextsAreErrorsNamingTheFieldAndTheAcceptedValues) {
  EXPECT_EQ(policy_error_of([] { parse_lease_state("paused"); }),
            "state: 'paused' is not one of pending_approval, queued, granted, revoking, released, expired, rejected");
  EXPECT_EQ(policy_error_of([] { parse_approval_state("Approved"); }),
            "state: 'Approved' is not one of pending, approved, rejected, cancelled");
  EXPECT_EQ(policy_error_of([] { parse_outcome("done"); }),
            "outcome: 'done' is not one of completed, preempted, failed, cancelled");
  // the empty text is no lease or approval state (only Outcome::kNone is written as "")
  EXPECT_NE(policy_error_of([] { parse_lease_state(""); }), "");
  EXPECT_NE(policy_error_of([] { parse_approval_state(""); }), "");
}

TEST(QuotaCodec, ApprovalRecordRoundTripsWithItsStateAsText) {
  Approval approval;
  approval.id = 7;
  approval.lease_id = 3;
  approval.team = "team-cv";
  approval.state = ApprovalState::kCancelled;
  const json record = to_json(approval);
  EXPECT_EQ(record["state"], "cancelled");  // the stored and wire text is unchanged
  EXPECT_EQ(approval_from_json(record).state, ApprovalState::kCancelled);
  // records from before the state field default to pending, as they always did
  json without_state = record;
  without_state.erase("state");
  EXPECT_EQ(approval_from_json(without_state).state, ApprovalState::kPending);
}

TEST(QuotaCodec, LeaseRecordWithAnUnknownStateOrOutcomeIsRejectedNamingTheField) {
  const Policy policy = testing::example_policy();
  Lease lease;
  lease.id = 5;
  lease.req.team = "team-cv";
  lease.state = LeaseState::kReleased;
  lease.outcome = Outcome::kCompleted;
  const json record = to_json(lease, policy);
  EXPECT_EQ(lease_from_json(record).state, LeaseState::kReleased);
  EXPECT_EQ(lease_from_json(record).outcome, Outcome::kCompleted);

  json bad_state = record;
  bad_state["state"] = "paused";
  EXPECT_EQ(policy_error_of([&] { lease_from_json(bad_state); }).rfind("state: 'paused'", 0), 0u);
  json bad_outcome = record;
  bad_outcome["outcome"] = "done";
  EXPECT_EQ(policy_error_of([&] { lease_from_json(bad_outcome); }).rfind("outcome: 'done'", 0), 0u);
  json bad_priority = record;
  bad_priority["request"]["priority"] = "urgent";
  EXPECT_EQ(policy_error_of([&] { lease_from_json(bad_priority); }).rfind("request.priority: 'urgent'", 0), 0u);
}

TEST(QuotaCodec, ApprovalRecordWithAnUnknownStateIsRejectedNamingTheField) {
  json record = to_json(Approval{});
  record["state"] = "withdrawn";
  EXPECT_EQ(policy_error_of([&] { approval_from_json(record); }).rfind("state: 'withdrawn'", 0), 0u);
}

// Request bodies are parsed strictly: nlohmann would skip a byte-order mark and keep the last of two equal keys.
TEST(QuotaCodec, RequestBodiesRefuseAByteOrderMarkAndDuplicateKeys) {
  EXPECT_EQ(parse_request_body(""), json::object());
  EXPECT_EQ(parse_request_body(R"({"a": {"b": 1}, "b": 2})")["b"], 2);  // the same key in another object is fine
  EXPECT_THROW(parse_request_body("\xEF\xBB\xBF{}"), RequestError);
  EXPECT_THROW(parse_request_body(R"({"gpus": 1, "gpus": 8})"), RequestError);
  EXPECT_THROW(parse_request_body(R"({"telemetry": {"step": 1, "step": 2}})"), RequestError);
  EXPECT_THROW(parse_request_body(R"([{"x": 1, "x": 1}])"), RequestError);
  EXPECT_THROW(parse_request_body("{\"gpus\": "), RequestError);
  try {
    parse_request_body(R"({"model": "yolov8n", "model": "yolov8x"})");
    ADD_FAILURE() << "a duplicate key was accepted";
  } catch (const RequestError& error) {
    EXPECT_NE(std::string(error.what()).find("'model' appears twice"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace yolo8::quota
