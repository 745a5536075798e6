// The ledger's API: loan applications, contribution credits and a member's balance.
//   POST /v1/loans {amount_gpu_hours, justification}      a member applies for this month      201 the loan
//                                                         (a repeated Idempotency-Key: 200, the same loan)
//   GET  /v1/loans[?state=S]  GET /v1/loans/{id}           own (members), the team's (leads), all (admins)
//   POST /v1/loans/{id}/approve|reject {note?}             a lead of the team or an admin, never the applicant
//   POST /v1/credits {user, amount_gpu_hours, reason}      a lead of the member's team or an admin   201 the grant
//   GET  /v1/credits                                       grants, visible as loans are
//   GET  /v1/balance[?user=U][&month=YYYY-MM]              the figures behind a member's allowance
#include <algorithm>
#include <cmath>

#include "quota/core/codec.h"
#include "quota/service/service.h"

namespace yolo8::quota {

using nlohmann::json;

namespace {

int status_of(LedgerError::Kind kind) {
  switch (kind) {
    case LedgerError::Kind::kInvalid: return 400;
    case LedgerError::Kind::kForbidden: return 403;
    case LedgerError::Kind::kNotFound: return 404;
    case LedgerError::Kind::kConflict: return 409;
    case LedgerError::Kind::kLimit: return 429;
  }
  return 400;
}

json object_body(const std::string& body) {
  const json parsed = parse_request_body(body);
  if (!parsed.is_object()) throw RequestError("body: must be a JSON object");
  return parsed;
}

std::string string_field(const json& body, const char* key) {
  if (!body.contains(key)) return "";
  if (!body[key].is_string()) throw RequestError(std::string(key) + ": has the wrong type (a string)");
  std::string text = body[key].get<std::string>();
  check_text(key, text, true);
  return text;
}

// A finite positive number of GPU-hours (a string, a boolean or null is refused, not converted).
double amount_field(const json& body) {
  if (!body.contains("amount_gpu_hours")) throw RequestError("amount_gpu_hours: required");
  const json& value = body["amount_gpu_hours"];
  if (!value.is_number()) throw RequestError("amount_gpu_hours: has the wrong type (a number of GPU-hours)");
  const double amount = value.get<double>();
  if (!std::isfinite(amount) || !(amount > 0)) throw RequestError("amount_gpu_hours: must be a finite number > 0");
  return amount;
}

bool parse_positive_id(const std::string& text, int64_t& out) {
  if (text.empty() || text.size() > 15 ||
      !std::all_of(text.begin(), text.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
    return false;
  }
  out = std::stoll(text);
  return out > 0;
}

bool is_month(const std::string& text) {
  auto digit = [](char ch) { return ch >= '0' && ch <= '9'; };
  if (text.size() != 7 || text[4] != '-' || !std::all_of(text.begin(), text.begin() + 4, digit) || !digit(text[5]) ||
      !digit(text[6])) {
    return false;
  }
  const int number = std::stoi(text.substr(5, 2));
  return number >= 1 && number <= 12;
}

}  // namespace

ApiResponse QuotaService::ledger_route(const Caller& caller, const ApiRequest& req, const Parts& parts) {
  const bool get = req.method == "GET";
  // who sees a member's loans, grants and balance: the member, a lead of the member's team, an admin
  auto can_see = [&](const std::string& user, const std::string& team) {
    return caller.role == Role::kAdmin || user == caller.name || (caller.role == Role::kLead && team == caller.team);
  };
  auto refusal = [](const LedgerError& refused) { return error_response(status_of(refused.kind()), refused.what()); };

  if (parts[1] == "loans" && parts.size() == 2 && get) {
    const auto state = req.query.find("state");
    if (state != req.query.end()) parse_loan_state(state->second);  // 400 naming the accepted states
    return read_locked([&] {
      json items = json::array();
      for (const auto& [id, loan] : engine().loans()) {
        if (!can_see(loan.user, loan.team)) continue;
        if (state != req.query.end() && to_string(loan.state) != state->second) continue;
        items.push_back(to_json(loan));
      }
      ApiResponse response;
      response.body = json{{"loans", items}};
      return response;
    });
  }
  if (parts[1] == "loans" && parts.size() == 2) {
    const json body = object_body(req.body);
    const double amount = amount_field(body);
    const std::string justification = string_field(body, "justification");
    const std::string user = string_field(body, "user");
    if (!user.empty() && user != caller.name) {
      return error_response(
          403, "user: " + caller.name + " cannot apply for a loan for " + user + " (members apply for themselves)");
    }
    if (req.idempotency_key.size() > 128) throw RequestError("Idempotency-Key: longer than 128 characters");
    check_text("Idempotency-Key", req.idempotency_key, false);
    return locked([&] {
      try {
        ApiResponse response;
        bool replayed = false;
        response.body = to_json(
            engine().apply_loan(caller.name, amount, justification, host_.now(), req.idempotency_key, &replayed));
        response.body["replayed"] = replayed;
        response.status = replayed ? 200 : 201;
        return response;
      } catch (const LedgerError& refused) {
        return refusal(refused);
      }
    });
  }
  if (parts[1] == "loans") {
    int64_t id = 0;
    if (!parse_positive_id(parts[2], id)) return error_response(404, "unknown loan '" + parts[2] + "'");
    if (parts.size() == 3) {
      return read_locked([&] {
        const Loan* loan = engine().find_loan(id);
        if (loan == nullptr) return error_response(404, "unknown loan " + std::to_string(id));
        if (!can_see(loan->user, loan->team)) {
          return error_response(403,
                                "loan " + std::to_string(id) + " belongs to " + loan->user + " of team " + loan->team);
        }
        ApiResponse response;
        response.body = to_json(*loan);
        return response;
      });
    }
    const json body = object_body(req.body);
    const std::string note = string_field(body, "note");
    if (note.size() > 2000) throw RequestError("note: longer than 2000 characters");
    return locked([&] {
      try {
        ApiResponse response;
        response.body = to_json(engine().decide_loan(id, parts[3] == "approve", caller.name, note, host_.now()));
        return response;
      } catch (const LedgerError& refused) {
        return refusal(refused);
      }
    });
  }
  if (parts[1] == "credits" && get) {
    return read_locked([&] {
      json items = json::array();
      for (const auto& [id, grant] : engine().grants()) {
        if (can_see(grant.user, grant.team)) items.push_back(to_json(grant));
      }
      ApiResponse response;
      response.body = json{{"grants", items}};
      return response;
    });
  }
  if (parts[1] == "credits") {
    if (caller.role == Role::kMember) return error_response(403, "role: credits are granted by team leads and admins");
    const json body = object_body(req.body);
    const std::string user = string_field(body, "user");
    if (user.empty()) throw RequestError("user: required (the member who contributed)");
    const double amount = amount_field(body);
    const std::string reason = string_field(body, "reason");
    return locked([&] {
      try {
        ApiResponse response;
        response.status = 201;
        response.body = to_json(engine().grant_credits(user, amount, reason, caller.name, host_.now()));
        return response;
      } catch (const LedgerError& refused) {
        return refusal(refused);
      }
    });
  }
  // GET /v1/balance
  auto user_it = req.query.find("user");
  const std::string user = user_it == req.query.end() ? caller.name : user_it->second;
  auto month_it = req.query.find("month");
  if (month_it != req.query.end() && !is_month(month_it->second)) {
    throw RequestError("month: expected YYYY-MM, got '" + month_it->second + "'");
  }
  const auto member = policy_.users.find(user);
  if (member == policy_.users.end()) return error_response(404, "user: unknown user '" + user + "'");
  if (!can_see(user, member->second.team)) {
    return error_response(403, "user: " + caller.name + " may not see the balance of " + user);
  }
  return read_locked([&] {
    const int64_t now = host_.now();
    const std::string month = month_it == req.query.end() ? month_key(now) : month_it->second;
    const MonthCredit credit = engine().month_credit_of(user, month);
    const double used = engine().used_gpu_hours(user, month, now);
    json loans = json::array(), grants = json::array();
    for (const auto& [id, loan] : engine().loans()) {
      if (loan.user == user && loan.month == month) loans.push_back(to_json(loan));
    }
    for (const auto& [id, grant] : engine().grants()) {
      if (grant.user == user && grant.month == month) grants.push_back(to_json(grant));
    }
    ApiResponse response;
    response.body = json{{"user", user},
                         {"team", member->second.team},
                         {"month", month},
                         {"monthly_gpu_hours", credit.monthly},
                         {"automatic_loan_gpu_hours", credit.automatic_loan},
                         {"loans_gpu_hours", credit.loans},
                         {"grants_gpu_hours", credit.grants},
                         {"repaying_gpu_hours", credit.debt},
                         {"allowance_gpu_hours", credit.allowance()},
                         {"used_gpu_hours", used},
                         {"balance_gpu_hours", credit.allowance() - used},
                         {"loans", loans},
                         {"grants", grants}};
    return response;
  });
}

}  // namespace yolo8::quota
