// Unit tests of the control messages: round trips, strict decoding, and docs/protocol.md checked against the code.
#include <catch2/catch.hpp>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "vmmckpt/protocol/control_messages.hpp"

namespace control = vmmckpt::control;
using nlohmann::json;

namespace {

template <typename Reply>
Reply decode_ok(const std::string& payload) {
  auto decoded = control::decode_reply<Reply>(payload);
  REQUIRE(std::holds_alternative<Reply>(decoded));
  return std::get<Reply>(decoded);
}

std::string reencode_reply(control::op o, const std::string& payload) {
  switch (o) {
    case control::op::hello: return control::encode(decode_ok<control::hello_reply>(payload));
    case control::op::dump_begin: return control::encode(decode_ok<control::dump_begin_reply>(payload));
    case control::op::dump_end: return control::encode(decode_ok<control::dump_end_reply>(payload));
    case control::op::suspend: return control::encode(decode_ok<control::suspend_reply>(payload));
    case control::op::resume: return control::encode(decode_ok<control::resume_reply>(payload));
    case control::op::check: return control::encode(decode_ok<control::check_reply>(payload));
    case control::op::ipc_open: return control::encode(decode_ok<control::ipc_open_reply>(payload));
    case control::op::ipc_close: return control::encode(decode_ok<control::ipc_close_reply>(payload));
    case control::op::vmm_identify:
    case control::op::vmm_share: return control::encode(decode_ok<control::vmm_share_reply>(payload));
    case control::op::vmm_unshare: return control::encode(decode_ok<control::vmm_unshare_reply>(payload));
    case control::op::cut_arm:
    case control::op::cut_targets:
    case control::op::cut_release: return control::encode(decode_ok<control::cut_status>(payload));
    case control::op::peek: return control::encode(decode_ok<control::peek_reply>(payload));
    case control::op::poke: return control::encode(decode_ok<control::poke_reply>(payload));
    case control::op::regions: return control::encode(decode_ok<control::regions_reply>(payload));
  }
  return {};
}

// Every object key in a JSON value, at any depth.
void collect_keys(const json& v, std::set<std::string>& keys) {
  if (v.is_object()) {
    for (const auto& [key, value] : v.items()) {
      keys.insert(key);
      collect_keys(value, keys);
    }
  } else if (v.is_array()) {
    for (const auto& e : v) collect_keys(e, keys);
  }
}

std::string read_doc() {
  std::ifstream in(VMMCKPT_PROTOCOL_DOC);
  REQUIRE(in.good());
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The text of the section headed "### `name`", up to the next heading of that level or above.
std::string section(const std::string& doc, const std::string& name) {
  const std::string heading = "### `" + name + "`";
  const auto start = doc.find(heading);
  if (start == std::string::npos) return {};
  auto end = doc.find("\n#", start + heading.size());
  return doc.substr(start, end == std::string::npos ? std::string::npos : end - start);
}

bool mentions(const std::string& text, const std::string& key) {
  return text.find("\"" + key + "\"") != std::string::npos || text.find("`" + key + "`") != std::string::npos;
}

}  // namespace

TEST_CASE("every message survives encode and decode unchanged", "[control]") {
  for (const auto& ex : control::example_messages()) {
    INFO(control::name_of(ex.operation));
    const auto request = control::decode_request(ex.request);
    REQUIRE(std::holds_alternative<control::request>(request));
    REQUIRE(control::encode(std::get<control::request>(request)) == ex.request);
    REQUIRE(reencode_reply(ex.operation, ex.reply) == ex.reply);
  }
  const auto refused = control::decode_reply<control::hello_reply>(control::example_failure());
  REQUIRE(std::holds_alternative<control::failure_reply>(refused));
  REQUIRE(std::get<control::failure_reply>(refused).code == control::refusal::not_suspended);
  REQUIRE(control::decode_fds_frame(control::example_fds_frame()).count == 250);
  const auto progress = control::decode_progress_frame(control::example_progress_frame());
  REQUIRE(progress.has_value());
  REQUIRE(control::encode(*progress) == control::example_progress_frame());
  // The resume's reply is not a progress frame; a progress frame missing a field is refused.
  for (const auto& ex : control::example_messages())
    if (ex.operation == control::op::resume) REQUIRE_FALSE(control::decode_progress_frame(ex.reply).has_value());
  REQUIRE_THROWS_AS(control::decode_progress_frame(R"({"op":"progress","bytes_done":1})"), control::decode_error);
}

TEST_CASE("the allocation table travels apart and comes back whole", "[control]") {
  auto reply = std::get<control::dump_begin_reply>(
      control::decode_reply<control::dump_begin_reply>(control::example_messages()[1].reply));
  REQUIRE(reply.pools[0].allocation_count == 1);
  REQUIRE(reply.pools[0].allocations.empty());
  control::dump_begin_reply sent = reply;
  sent.pools[0].allocations = {{0x200000000000, 4096, vmmckpt::alloc_api::cuda_malloc}};
  sent.pools[1].allocations = {{0x300000000000, 20971520, vmmckpt::alloc_api::cu_mem_map}};
  const std::string table = control::encode_allocation_table(sent.pools);
  REQUIRE(table.size() == 48);
  control::decode_allocation_table(table, reply.pools);
  REQUIRE(reply == sent);
  // A table that does not match the counts, or names an unknown API, is refused.
  CHECK_THROWS_AS(control::decode_allocation_table(table + "x", reply.pools), control::decode_error);
  CHECK_THROWS_AS(control::decode_allocation_table("", reply.pools), control::decode_error);
  std::string bad = table;
  bad[16] = 42;
  CHECK_THROWS_AS(control::decode_allocation_table(bad, reply.pools), control::decode_error);
  reply.pools[0].allocation_count = ~0ULL;  // a count no table could hold is refused, not allocated
  CHECK_THROWS_AS(control::decode_allocation_table(table, reply.pools), control::decode_error);
}

TEST_CASE("requests that are not ours are answered, not acted on", "[control]") {
  auto refusal_of = [](const std::string& payload) {
    const auto decoded = control::decode_request(payload);
    REQUIRE(std::holds_alternative<control::failure_reply>(decoded));
    return std::get<control::failure_reply>(decoded);
  };
  CHECK(refusal_of(R"({"op":"fly"})").code == control::refusal::unknown_op);
  CHECK(refusal_of(R"({"op":"fly"})").error == "unknown op 'fly'");
  // A reply quotes the request printably: it goes back as JSON and into logs.
  CHECK(refusal_of("{\"op\":\"fl\xc3\xbf\\u0001\"}").error == "unknown op 'fl\\xc3\\xbf\\x01'");
  for (const char* bad :
       {R"({"op":5})", R"({"op":null})", R"({})", R"([1,2])", "not json", "", R"({"op":"dump_begin"})",
        R"({"op":"dump_begin","hold_deadline_ms":"5"})", R"({"op":"dump_begin","hold_deadline_ms":1e99})",
        R"({"op":"dump_begin","hold_deadline_ms":5})", R"({"op":"suspend"})", R"({"op":"resume"})",
        R"({"op":"suspend","image":7})", R"({"op":"hello","prepare_hold":1})",
        "[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]"}) {
    INFO(bad);
    const auto r = refusal_of(bad);
    CHECK(r.code == control::refusal::bad_request);
    CHECK(r.error.rfind("malformed request: ", 0) == 0);
  }
  // hello's prepare_hold is optional: false when absent.
  const auto plain = control::decode_request(R"({"op":"hello"})");
  REQUIRE(std::holds_alternative<control::request>(plain));
  CHECK_FALSE(std::get<control::hello_request>(std::get<control::request>(plain)).prepare_hold);
  CHECK(control::encode(control::request{control::hello_request{}}) == R"({"op":"hello"})");
  // A field a newer tool adds is ignored.
  const auto newer =
      control::decode_request(R"({"op":"dump_begin","hold_deadline_ms":1000,"valid_until_ms":5,"colour":"blue"})");
  REQUIRE(std::holds_alternative<control::request>(newer));
  REQUIRE(std::get<control::dump_begin_request>(std::get<control::request>(newer)).hold_deadline ==
          std::chrono::milliseconds(1000));
}

TEST_CASE("replies are decoded strictly, naming the field at fault", "[control]") {
  auto error_of = [](const std::string& payload) -> std::string {
    try {
      control::decode_reply<control::dump_begin_reply>(payload);
    } catch (const control::decode_error& e) {
      return e.what();
    }
    return "decoded";
  };
  const json good = json::parse(control::example_messages()[1].reply);
  json j = good;
  j["pools"][0]["segments"][0]["addr"] = "0x" + std::string(17, 'f');
  CHECK(error_of(j.dump()) ==
        "pools[0].segments[0].addr: expected an address as a \"0x\" hex string of at most 16 digits");
  j = good;
  j["pools"][0]["base"] = "200000000000";  // no 0x: not read as decimal or anything else
  CHECK(error_of(j.dump()).rfind("pools[0].base: ", 0) == 0);
  j = good;
  j["pools"][0].erase("granularity");
  CHECK(error_of(j.dump()) == "pools[0]: missing field 'granularity'");
  j = good;
  j["fd_count"] = -1;
  CHECK(error_of(j.dump()) == "fd_count: expected a non-negative integer below 2^64");
  j = good;
  j["ok"] = "yes";
  CHECK(error_of(j.dump()) == "ok: expected true or false");
  CHECK(error_of("[]") == "reply: expected an object");
  // A refusal without a code this tool knows is a plain failure, with its text.
  const auto refused = control::decode_reply<control::check_reply>(R"({"ok":false,"code":"later","error":"no"})");
  REQUIRE(std::get<control::failure_reply>(refused) == control::failure_reply{control::refusal::failed, "no"});
}

TEST_CASE("hello's activity and dump_begin's purpose: optional, and refused when unknown", "[control]") {
  json hello = json::parse(control::example_messages()[0].reply);
  REQUIRE(hello.at("activity") == "idle");
  hello["activity"] = "dumping";
  REQUIRE(decode_ok<control::hello_reply>(hello.dump()).activity == control::activity::dumping);
  hello.erase("activity");  // an older process: idle
  REQUIRE(decode_ok<control::hello_reply>(hello.dump()).activity == control::activity::idle);
  hello["activity"] = "napping";
  REQUIRE_THROWS_WITH(control::decode_reply<control::hello_reply>(hello.dump()),
                      Catch::Contains("activity: unknown value"));

  auto begin = [](const std::string& payload) {
    return std::get<control::dump_begin_request>(std::get<control::request>(control::decode_request(payload)));
  };
  const control::dump_begin_request for_suspend{std::chrono::milliseconds(1000), 5, true, std::nullopt};
  REQUIRE(begin(control::encode(control::request{for_suspend})).for_suspend);
  REQUIRE_FALSE(begin(R"({"op":"dump_begin","hold_deadline_ms":1000,"valid_until_ms":5})").for_suspend);
  const auto bad =
      control::decode_request(R"({"op":"dump_begin","hold_deadline_ms":1000,"valid_until_ms":5,"purpose":"x"})");
  REQUIRE(std::get<control::failure_reply>(bad).code == control::refusal::bad_request);
}

TEST_CASE("docs/protocol.md describes every op and every field the code sends", "[control]") {
  const std::string doc = read_doc();
  for (const auto& ex : control::example_messages()) {
    const std::string name(control::name_of(ex.operation));
    INFO("op " << name);
    const std::string text = section(doc, name);
    REQUIRE_FALSE(text.empty());  // a section "### `op`"
    std::set<std::string> keys;
    collect_keys(json::parse(ex.request), keys);
    collect_keys(json::parse(ex.reply), keys);
    for (const auto& key : keys) {
      INFO("field " << key);
      CHECK((mentions(text, key) || key == "ok" || key == "op"));
    }
  }
  std::set<std::string> keys;
  collect_keys(json::parse(control::example_failure()), keys);
  collect_keys(json::parse(control::example_fds_frame()), keys);
  collect_keys(json::parse(control::example_progress_frame()), keys);
  for (const auto& key : keys) {
    INFO("field " << key);
    CHECK(mentions(doc, key));
  }
  for (auto r : {control::refusal::failed, control::refusal::bad_request, control::refusal::unknown_op,
                 control::refusal::suspended, control::refusal::not_suspended, control::refusal::not_held,
                 control::refusal::not_quiesced, control::refusal::busy, control::refusal::expired,
                 control::refusal::withdrawn}) {
    INFO("refusal " << control::name_of(r));
    CHECK(mentions(doc, std::string(control::name_of(r))));
  }
}

TEST_CASE("the memory a process does not own travels by kind, and an older process's silence reads as none",
          "[control]") {
  const auto held = decode_ok<control::dump_begin_reply>(control::example_messages()[1].reply);
  REQUIRE(held.not_owned == std::vector<control::not_owned_memory>{{"managed", 67108864}, {"arrays", 1048576}});
  const auto hello = decode_ok<control::hello_reply>(control::example_messages()[0].reply);
  REQUIRE(hello.not_owned == std::vector<control::not_owned_memory>{{"managed", 67108864}});

  json older = json::parse(control::example_messages()[1].reply);
  older.erase("not_owned");
  REQUIRE(decode_ok<control::dump_begin_reply>(older.dump()).not_owned.empty());
  older = json::parse(control::example_messages()[0].reply);
  older.erase("not_owned");
  REQUIRE(decode_ok<control::hello_reply>(older.dump()).not_owned.empty());

  auto error_of = [](const json& j) -> std::string {
    try {
      control::decode_reply<control::dump_begin_reply>(j.dump());
    } catch (const control::decode_error& e) {
      return e.what();
    }
    return "decoded";
  };
  json bad = json::parse(control::example_messages()[1].reply);
  bad["not_owned"][1]["kind"] = "";
  CHECK(error_of(bad) == "not_owned[1].kind: empty");
  bad = json::parse(control::example_messages()[1].reply);
  bad["not_owned"][0]["bytes"] = -5;
  CHECK(error_of(bad).rfind("not_owned[0].bytes: ", 0) == 0);
  bad = json::parse(control::example_messages()[1].reply);
  bad["not_owned"] = "managed";
  CHECK(error_of(bad).rfind("not_owned: ", 0) == 0);
}
