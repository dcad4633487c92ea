// Encoding and strict decoding of every control message (docs/protocol.md), shared by the shim and cuda-ckpt.
#include "vmmckpt/protocol/control_messages.hpp"

#include <time.h>

#include "vmmckpt/pool/alloc_api.hpp"
#include "vmmckpt/support/hex_text.hpp"
#include "vmmckpt/support/little_endian.hpp"
#include "vmmckpt/protocol/protocol.hpp"
#include "message_codec.hpp"

namespace vmmckpt::control {
namespace {

using namespace json_fields;
using namespace codec;

constexpr process_state all_states[] = {process_state::running, process_state::suspended, process_state::paused};
constexpr activity all_activities[] = {activity::idle, activity::dumping, activity::suspending, activity::resuming};

// ---- pieces shared by several messages ----
// A pool's "kind": "pool" (the default when absent) or "vmm"; true for vmm.
bool decode_kind(const json& pool, const std::string& path) {
  const json* kind = optional_field(pool, "kind");
  if (kind == nullptr) return false;
  const std::string k = string_at(*kind, join(path, "kind"));
  if (k != "pool" && k != "vmm") throw decode_error(join(path, "kind") + ": unknown value \"" + printable(k) + "\"");
  return k == "vmm";
}

ojson encode_not_owned(const std::vector<not_owned_memory>& list) {
  return array_of_each(list, [](const not_owned_memory& m) { return ojson{{"kind", m.kind}, {"bytes", m.bytes}}; });
}

// Optional: a process older than the list sends none, which reads as nothing not owned.
std::vector<not_owned_memory> decode_not_owned(const json& root) {
  std::vector<not_owned_memory> out;
  if (optional_field(root, "not_owned") == nullptr) return out;
  for_each_object(root, "", "not_owned", [&](const json& m, const std::string& p) {
    not_owned_memory entry{string_of(m, p, "kind"), u64_of(m, p, "bytes")};
    if (entry.kind.empty()) throw decode_error(join(p, "kind") + ": empty");
    out.push_back(std::move(entry));
  });
  return out;
}

ojson encode_pids(const std::vector<std::int64_t>& pids) {
  ojson out = ojson::array();
  for (const std::int64_t p : pids) out.push_back(p);
  return out;
}

std::vector<std::int64_t> decode_pids(const json& root, const std::string& path, const char* name) {
  std::vector<std::int64_t> out;
  const json& list = array_of(root, path, name);
  for (std::size_t i = 0; i < list.size(); ++i) {
    const std::string p = index(join(path, name), i);
    if (!list[i].is_number_integer() || list[i].get<std::int64_t>() <= 0) throw decode_error(p + ": expected a pid");
    out.push_back(list[i].get<std::int64_t>());
  }
  return out;
}

ojson encode_peer_counts(const std::vector<peer_count>& counts) {
  return array_of_each(counts, [](const peer_count& c) { return ojson{{"peer", c.peer}, {"count", c.count}}; });
}

std::vector<peer_count> decode_peer_counts(const json& root, const std::string& path, const char* name) {
  std::vector<peer_count> out;
  for_each_object(root, path, name, [&](const json& c, const std::string& p) {
    const int peer = int_of(c, p, "peer");
    if (peer < 0) throw decode_error(join(p, "peer") + ": negative");
    if (!out.empty() && out.back().peer >= peer) throw decode_error(join(p, "peer") + ": not in ascending order");
    out.push_back({peer, u64_of(c, p, "count")});
  });
  return out;
}

ojson encode_comm_counts(const std::vector<comm_count>& comms) {
  return array_of_each(comms, [](const comm_count& c) {
    return ojson{{"id", hex(c.id)},
                 {"rank", c.rank},
                 {"size", c.size},
                 {"ops", c.ops},
                 {"sends", encode_peer_counts(c.sends)},
                 {"recvs", encode_peer_counts(c.recvs)}};
  });
}

std::vector<comm_count> decode_comm_counts(const json& root, const char* name) {
  std::vector<comm_count> out;
  for_each_object(root, "", name, [&](const json& c, const std::string& p) {
    comm_count cc;
    cc.id = address_of(c, p, "id");
    cc.rank = int_of(c, p, "rank");
    cc.size = int_of(c, p, "size");
    if (cc.rank < 0 || cc.size < 0) throw decode_error(p + ": negative rank or size");
    cc.ops = u64_of(c, p, "ops");
    cc.sends = decode_peer_counts(c, p, "sends");
    cc.recvs = decode_peer_counts(c, p, "recvs");
    out.push_back(std::move(cc));
  });
  return out;
}

constexpr std::pair<resume_request::stage, const char*> resume_stages[] = {{resume_request::stage::load, "load"},
                                                                           {resume_request::stage::finish, "finish"}};

hello_reply decode_hello(const json& root) {
  hello_reply r;
  r.protocol = u32_of(root, "", "protocol");
  r.pid = i64_of(root, "", "pid");
  r.command = strings_of(root, "", "command");
  r.state = enum_at(field(root, "", "state"), "state", all_states);
  if (r.state == process_state::suspended) r.image = string_of(root, "", "image");
  r.devices = decode_devices(root);
  for_each_object(root, "", "pools", [&](const json& pj, const std::string& p) {
    r.pools.push_back({int_of(pj, p, "device"), address_of(pj, p, "base"), u64_of(pj, p, "size"),
                       u64_of(pj, p, "live_bytes"), u64_of(pj, p, "live_count"), u64_of(pj, p, "backed_bytes"),
                       decode_kind(pj, p)});
  });
  r.not_owned = decode_not_owned(root);
  // Optional: a process older than the field is idle as far as this tool can tell.
  if (const json* a = optional_field(root, "activity")) r.activity = enum_at(*a, "activity", all_activities);
  if (optional_field(root, "nccl_bytes") != nullptr) r.nccl_bytes = u64_of(root, "", "nccl_bytes");
  return r;
}

dump_begin_reply decode_dump_begin(const json& root) {
  dump_begin_reply r;
  r.fd_count = u32_of(root, "", "fd_count");
  r.hold_deadline = std::chrono::milliseconds(u32_of(root, "", "hold_deadline_ms"));
  r.devices = decode_devices(root);
  for_each_object(root, "", "pools", [&](const json& pj, const std::string& p) {
    pool_contents c;
    c.device = int_of(pj, p, "device");
    c.base = address_of(pj, p, "base");
    c.size = u64_of(pj, p, "size");
    c.granularity = u64_of(pj, p, "granularity");
    c.allocation_count = u64_of(pj, p, "allocation_count");
    for_each_object(pj, p, "segments", [&](const json& s, const std::string& q) {
      c.segments.push_back({address_of(s, q, "addr"), u64_of(s, q, "size")});
    });
    c.vmm = decode_kind(pj, p);
    r.pools.push_back(std::move(c));
  });
  if (const json* vmm = optional_field(root, "vmm")) r.vmm = vmm_layout_from_json(*vmm, "vmm");
  r.not_owned = decode_not_owned(root);
  r.ipc_imports = ipc_imports_from_json(root);  // a process older than the list maps nothing through IPC
  return r;
}

suspend_reply decode_suspend(const json& root) {
  suspend_reply r;
  r.freed_bytes = u64_of(root, "", "freed_bytes");
  r.held_us = u64_of(root, "", "held_us");
  for_each_object(root, "", "devices", [&](const json& d, const std::string& p) {
    r.devices.push_back({int_of(d, p, "device"), u64_of(d, p, "used_bytes_after")});
  });
  return r;
}

check_reply decode_check(const json& root) {
  check_reply r;
  r.consistent = bool_of(root, "", "consistent");
  r.problems = strings_of(root, "", "problems");
  return r;
}

}  // namespace

std::string_view name_of(op o) {
  switch (o) {
    case op::hello: return "hello";
    case op::dump_begin: return "dump_begin";
    case op::dump_end: return "dump_end";
    case op::suspend: return "suspend";
    case op::resume: return "resume";
    case op::check: return "check";
    case op::ipc_open: return "ipc_open";
    case op::ipc_close: return "ipc_close";
    case op::vmm_identify: return "vmm_identify";
    case op::vmm_share: return "vmm_share";
    case op::vmm_unshare: return "vmm_unshare";
    case op::cut_arm: return "cut_arm";
    case op::cut_targets: return "cut_targets";
    case op::cut_release: return "cut_release";
    case op::peek: return "peek";
    case op::poke: return "poke";
    case op::regions: return "regions";
  }
  return "?";
}

std::string_view name_of(refusal r) {
  switch (r) {
    case refusal::failed: return "failed";
    case refusal::bad_request: return "bad_request";
    case refusal::unknown_op: return "unknown_op";
    case refusal::suspended: return "suspended";
    case refusal::not_suspended: return "not_suspended";
    case refusal::not_held: return "not_held";
    case refusal::not_quiesced: return "not_quiesced";
    case refusal::busy: return "busy";
    case refusal::expired: return "expired";
    case refusal::withdrawn: return "withdrawn";
  }
  return "failed";
}

std::int64_t unix_ms_now() noexcept {
  timespec t{};
  ::clock_gettime(CLOCK_REALTIME, &t);
  return static_cast<std::int64_t>(t.tv_sec) * 1000 + t.tv_nsec / 1'000'000;
}

std::string_view name_of(process_state s) {
  switch (s) {
    case process_state::suspended: return "suspended";
    case process_state::paused: return "paused";
    default: return "running";
  }
}

std::string_view name_of(activity a) {
  switch (a) {
    case activity::idle: return "idle";
    case activity::dumping: return "dumping";
    case activity::suspending: return "suspending";
    case activity::resuming: return "resuming";
  }
  return "idle";
}

// ---- encoding ----
namespace {

// Each request's fields, after its op.
void encode_request(ojson& j, const hello_request& r) {
  j["op"] = name_of(op::hello);
  if (r.prepare_hold) j["prepare_hold"] = true;
}
void encode_request(ojson& j, const dump_begin_request& r) {
  j["op"] = name_of(op::dump_begin);
  j["hold_deadline_ms"] = r.hold_deadline.count();
  j["valid_until_ms"] = r.valid_until_ms;
  j["purpose"] = r.for_suspend ? "suspend" : "dump";
  if (r.job) {
    ojson job;
    job["dir"] = r.job->dir;
    job["image"] = r.job->image;
    job["image_id"] = r.job->image_id;
    job["ranks"] = encode_pids(r.job->ranks);
    j["job"] = std::move(job);
  }
}
void encode_request(ojson& j, const dump_end_request&) { j["op"] = name_of(op::dump_end); }
void encode_request(ojson& j, const suspend_request& r) {
  j["op"] = name_of(op::suspend);
  j["image"] = r.image;
  j["image_id"] = r.image_id;
  j["valid_until_ms"] = r.valid_until_ms;
}
void encode_request(ojson& j, const resume_request& r) {
  j["op"] = name_of(op::resume);
  j["valid_until_ms"] = r.valid_until_ms;
  if (r.progress) j["progress"] = true;
  if (!r.image.empty()) j["image"] = r.image;
  for (const auto& [stage, name] : resume_stages)
    if (r.step == stage) j["stage"] = name;
  if (!r.ranks.empty()) j["ranks"] = encode_pids(r.ranks);
}
void encode_request(ojson& j, const check_request&) { j["op"] = name_of(op::check); }
void encode_ipc_request(ojson& j, op which, std::uint64_t base, std::uint64_t generation) {
  j["op"] = name_of(which);
  j["base"] = hex(base);
  j["generation"] = generation;
}
void encode_request(ojson& j, const ipc_open_request& r) { encode_ipc_request(j, op::ipc_open, r.base, r.generation); }
void encode_request(ojson& j, const ipc_close_request& r) {
  encode_ipc_request(j, op::ipc_close, r.base, r.generation);
}
void encode_request(ojson& j, const vmm_identify_request&) { j["op"] = name_of(op::vmm_identify); }
void encode_request(ojson& j, const vmm_share_request& r) {
  j["op"] = name_of(op::vmm_share);
  j["token"] = hex(r.token);
}
void encode_request(ojson& j, const vmm_unshare_request& r) {
  j["op"] = name_of(op::vmm_unshare);
  j["token"] = hex(r.token);
}
void encode_request(ojson& j, const cut_arm_request& r) {
  j["op"] = name_of(op::cut_arm);
  j["hold_deadline_ms"] = r.hold_deadline.count();
  j["valid_until_ms"] = r.valid_until_ms;
}
void encode_request(ojson& j, const cut_targets_request& r) {
  j["op"] = name_of(op::cut_targets);
  j["targets"] = encode_comm_counts(r.targets);
  if (r.freeze) j["freeze"] = true;
}
void encode_request(ojson& j, const cut_release_request&) { j["op"] = name_of(op::cut_release); }

}  // namespace

std::string encode(const request& r) {
  ojson j;
  std::visit([&](const auto& req) { encode_request(j, req); }, r);
  return dump(j);
}

std::string encode(const hello_reply& r) {
  ojson j;
  j["ok"] = true;
  j["protocol"] = r.protocol;
  j["pid"] = r.pid;
  j["command"] = r.command;
  j["state"] = name_of(r.state);
  if (r.state == process_state::suspended) j["image"] = r.image;
  j["devices"] = encode_devices(r.devices);
  j["pools"] = array_of_each(r.pools, [](const pool_summary& p) {
    ojson pj{{"device", p.device},         {"base", hex(p.base)},        {"size", p.size},
             {"live_bytes", p.live_bytes}, {"live_count", p.live_count}, {"backed_bytes", p.backed_bytes}};
    if (p.vmm) pj["kind"] = "vmm";
    return pj;
  });
  j["not_owned"] = encode_not_owned(r.not_owned);
  j["activity"] = name_of(r.activity);
  j["nccl_bytes"] = r.nccl_bytes;
  return dump(j);
}

std::string encode(const dump_begin_reply& r) {
  ojson j;
  j["ok"] = true;
  j["fd_count"] = r.fd_count;
  j["hold_deadline_ms"] = r.hold_deadline.count();
  j["devices"] = encode_devices(r.devices);
  j["pools"] = array_of_each(r.pools, [](const pool_contents& p) {
    ojson pj{{"device", p.device},
             {"base", hex(p.base)},
             {"size", p.size},
             {"granularity", p.granularity},
             {"allocation_count", p.allocation_count},
             {"segments", array_of_each(p.segments, [](const segment_entry& s) {
                return ojson{{"addr", hex(s.addr)}, {"size", s.size}};
              })}};
    if (p.vmm) pj["kind"] = "vmm";
    return pj;
  });
  if (r.vmm) j["vmm"] = to_json(*r.vmm);
  j["not_owned"] = encode_not_owned(r.not_owned);
  if (!r.ipc_imports.empty()) j["ipc_imports"] = to_json(r.ipc_imports);
  return dump(j);
}

std::string encode(const fds_frame& r) { return dump(ojson{{"op", "fds"}, {"count", r.count}}); }

std::string encode(const progress_frame& r) {
  return dump(ojson{{"op", "progress"}, {"bytes_done", r.bytes_done}, {"bytes_total", r.bytes_total}});
}

std::string encode(const dump_end_reply& r) { return reply({{"held_us", r.held_us}}); }

std::string encode(const suspend_reply& r) {
  return reply({{"freed_bytes", r.freed_bytes},
                {"held_us", r.held_us},
                {"devices", array_of_each(r.devices, [](const device_usage& d) {
                   return ojson{{"device", d.device}, {"used_bytes_after", d.used_bytes_after}};
                 })}});
}

std::string encode(const resume_reply& r) {
  return reply({{"bytes", r.bytes}, {"seconds", r.seconds}, {"image", r.image}});
}

std::string encode(const check_reply& r) { return reply({{"consistent", r.consistent}, {"problems", r.problems}}); }

std::string encode(const ipc_open_reply& r) {
  return reply({{"device_uuid", r.device_uuid},
                {"base_offset", r.base_offset},
                {"pieces", array_of_each(r.pieces, [](const ipc_piece& p) {
                   return ojson{{"offset", p.offset}, {"size", p.size}};
                 })}});
}

std::string encode(const ipc_close_reply&) { return reply({}); }

std::string encode(const vmm_share_reply& r) {
  return reply({{"token", hex(r.token)}, {"size", r.size}, {"device_uuid", r.device_uuid}});
}

std::string encode(const vmm_unshare_reply&) { return reply({}); }

std::string encode(const cut_status& r) {
  return reply({{"op", "cut_status"},
                {"armed", r.armed},
                {"waiting", r.waiting},
                {"in_flight", r.in_flight},
                {"where", r.where},
                {"comms", encode_comm_counts(r.comms)}});
}
std::string encode(const failure_reply& r) {
  ojson j;
  j["ok"] = false;
  j["code"] = name_of(r.code);
  j["error"] = r.error;
  return dump(j);
}

// ---- decoding ----
namespace {

// Each request from its message, whose op names it.
request decode_hello_request(const json& root) {
  hello_request r;
  if (root.contains("prepare_hold")) r.prepare_hold = bool_of(root, "", "prepare_hold");
  return r;
}

request decode_dump_begin_request(const json& root) {
  dump_begin_request r;
  r.hold_deadline = std::chrono::milliseconds(int_of(root, "", "hold_deadline_ms"));
  r.valid_until_ms = i64_of(root, "", "valid_until_ms");
  if (optional_field(root, "purpose") != nullptr) {
    const std::string purpose = string_of(root, "", "purpose");
    if (purpose != "dump" && purpose != "suspend")
      throw decode_error("purpose: unknown value \"" + printable(purpose) + "\"");
    r.for_suspend = purpose == "suspend";
  }
  if (const json* job = optional_field(root, "job")) {
    object_at(*job, "job");
    r.job = job_suspend{string_of(*job, "job", "dir"), string_of(*job, "job", "image"),
                        string_of(*job, "job", "image_id"), decode_pids(*job, "job", "ranks")};
    if (!r.for_suspend) throw decode_error("job: only with the purpose \"suspend\"");
  }
  return r;
}

request decode_suspend_request(const json& root) {
  return suspend_request{string_of(root, "", "image"), string_of(root, "", "image_id"),
                         i64_of(root, "", "valid_until_ms")};
}

resume_request::stage decode_resume_stage(const json& root) {
  const std::string stage = string_of(root, "", "stage");
  for (const auto& [value, name] : resume_stages)
    if (stage == name) return value;
  throw decode_error("stage: unknown value \"" + printable(stage) + "\"");
}

request decode_resume_request(const json& root) {
  resume_request r;
  r.valid_until_ms = i64_of(root, "", "valid_until_ms");
  if (root.contains("progress")) r.progress = bool_of(root, "", "progress");
  if (root.contains("image")) r.image = string_of(root, "", "image");
  if (root.contains("stage")) r.step = decode_resume_stage(root);
  if (root.contains("ranks")) r.ranks = decode_pids(root, "", "ranks");
  return r;
}

request decode_cut_targets_request(const json& root) {
  cut_targets_request r{decode_comm_counts(root, "targets"), false};
  if (root.contains("freeze")) r.freeze = bool_of(root, "", "freeze");
  return r;
}

struct request_decoder {
  op which;
  request (*decode)(const json& root);
};

const request_decoder request_decoders[] = {
    {op::hello, decode_hello_request},
    {op::dump_begin, decode_dump_begin_request},
    {op::dump_end, [](const json&) -> request { return dump_end_request{}; }},
    {op::suspend, decode_suspend_request},
    {op::resume, decode_resume_request},
    {op::check, [](const json&) -> request { return check_request{}; }},
    {op::ipc_open,
     [](const json& root) -> request {
       return ipc_open_request{address_of(root, "", "base"), u64_of(root, "", "generation")};
     }},
    {op::ipc_close,
     [](const json& root) -> request {
       return ipc_close_request{address_of(root, "", "base"), u64_of(root, "", "generation")};
     }},
    {op::vmm_identify, [](const json&) -> request { return vmm_identify_request{}; }},
    {op::vmm_share, [](const json& root) -> request { return vmm_share_request{address_of(root, "", "token")}; }},
    {op::vmm_unshare, [](const json& root) -> request { return vmm_unshare_request{address_of(root, "", "token")}; }},
    {op::cut_arm,
     [](const json& root) -> request {
       return cut_arm_request{std::chrono::milliseconds(int_of(root, "", "hold_deadline_ms")),
                              i64_of(root, "", "valid_until_ms")};
     }},
    {op::cut_targets, decode_cut_targets_request},
    {op::cut_release, [](const json&) -> request { return cut_release_request{}; }},
    {op::peek, decode_peek_request},
    {op::poke, decode_poke_request},
    {op::regions, [](const json&) -> request { return regions_request{}; }},
};

}  // namespace

std::variant<request, failure_reply> decode_request(const std::string& payload) {
  try {
    const json root = parse_limited(payload, max_depth);
    const std::string name = string_of(object_at(root, "request"), "", "op");
    for (const auto& d : request_decoders)
      if (name == name_of(d.which)) return d.decode(root);
    return failure_reply{refusal::unknown_op, "unknown op '" + printable(name) + "'"};
  } catch (const decode_error& e) {
    return failure_reply{refusal::bad_request, std::string("malformed request: ") + e.what()};
  }
}

template <>
std::variant<hello_reply, failure_reply> decode_reply<hello_reply>(const std::string& payload) {
  return decode_reply_with<hello_reply>(payload, decode_hello);
}
template <>
std::variant<dump_begin_reply, failure_reply> decode_reply<dump_begin_reply>(const std::string& payload) {
  return decode_reply_with<dump_begin_reply>(payload, decode_dump_begin);
}
template <>
std::variant<dump_end_reply, failure_reply> decode_reply<dump_end_reply>(const std::string& payload) {
  return decode_reply_with<dump_end_reply>(
      payload, [](const json& root) { return dump_end_reply{u64_of(root, "", "held_us")}; });
}
template <>
std::variant<suspend_reply, failure_reply> decode_reply<suspend_reply>(const std::string& payload) {
  return decode_reply_with<suspend_reply>(payload, decode_suspend);
}
template <>
std::variant<resume_reply, failure_reply> decode_reply<resume_reply>(const std::string& payload) {
  return decode_reply_with<resume_reply>(payload, [](const json& root) {
    return resume_reply{u64_of(root, "", "bytes"), number_of(root, "", "seconds"), string_of(root, "", "image")};
  });
}
template <>
std::variant<check_reply, failure_reply> decode_reply<check_reply>(const std::string& payload) {
  return decode_reply_with<check_reply>(payload, decode_check);
}

template <>
std::variant<ipc_open_reply, failure_reply> decode_reply<ipc_open_reply>(const std::string& payload) {
  return decode_reply_with<ipc_open_reply>(payload, [](const json& root) {
    ipc_open_reply r;
    r.device_uuid = string_of(root, "", "device_uuid");
    r.base_offset = u64_of(root, "", "base_offset");
    if (array_of(root, "", "pieces").size() > static_cast<std::size_t>(protocol::max_fds_per_message))
      throw decode_error("pieces: more than one frame's descriptors");
    for_each_object(root, "", "pieces", [&](const json& pj, const std::string& p) {
      r.pieces.push_back({u64_of(pj, p, "offset"), u64_of(pj, p, "size")});
    });
    return r;
  });
}
template <>
std::variant<ipc_close_reply, failure_reply> decode_reply<ipc_close_reply>(const std::string& payload) {
  return decode_reply_with<ipc_close_reply>(payload, [](const json&) { return ipc_close_reply{}; });
}

template <>
std::variant<vmm_share_reply, failure_reply> decode_reply<vmm_share_reply>(const std::string& payload) {
  return decode_reply_with<vmm_share_reply>(payload, [](const json& root) {
    return vmm_share_reply{address_of(root, "", "token"), u64_of(root, "", "size"), string_of(root, "", "device_uuid")};
  });
}
template <>
std::variant<vmm_unshare_reply, failure_reply> decode_reply<vmm_unshare_reply>(const std::string& payload) {
  return decode_reply_with<vmm_unshare_reply>(payload, [](const json&) { return vmm_unshare_reply{}; });
}

template <>
std::variant<cut_status, failure_reply> decode_reply<cut_status>(const std::string& payload) {
  return decode_reply_with<cut_status>(payload, [](const json& root) {
    if (string_of(root, "", "op") != "cut_status") throw decode_error("op: expected \"cut_status\"");
    cut_status r;
    r.armed = bool_of(root, "", "armed");
    r.waiting = int_of(root, "", "waiting");
    r.in_flight = int_of(root, "", "in_flight");
    r.where = string_of(root, "", "where");
    r.comms = decode_comm_counts(root, "comms");
    return r;
  });
}

fds_frame decode_fds_frame(const std::string& payload) {
  const json root = parse_limited(payload, max_depth);
  if (string_of(object_at(root, "frame"), "", "op") != "fds") throw decode_error("op: expected \"fds\"");
  return fds_frame{u32_of(root, "", "count")};
}

std::optional<progress_frame> decode_progress_frame(const std::string& payload) {
  const json root = parse_limited(payload, max_depth);
  if (!root.is_object()) return std::nullopt;
  const auto op_field = root.find("op");
  if (op_field == root.end() || !op_field->is_string() || op_field->get<std::string>() != "progress")
    return std::nullopt;
  return progress_frame{u64_of(root, "", "bytes_done"), u64_of(root, "", "bytes_total")};
}

std::size_t allocation_table_bytes(const std::vector<pool_contents>& pools) {
  std::size_t count = 0;
  for (const auto& p : pools) count += p.allocations.size();
  return count * allocation_record_size;
}

void encode_allocation_table(const std::vector<pool_contents>& pools, unsigned char* at) {
  for (const auto& p : pools)
    for (const auto& a : p.allocations) {
      put_allocation_record(at, {a.addr, a.size, static_cast<std::uint32_t>(a.api), 0});
      at += allocation_record_size;
    }
}

std::string encode_allocation_table(const std::vector<pool_contents>& pools) {
  std::string out(allocation_table_bytes(pools), '\0');
  encode_allocation_table(pools, reinterpret_cast<unsigned char*>(out.data()));
  return out;
}

void decode_allocation_table(std::string_view table, std::vector<pool_contents>& pools) {
  std::uint64_t count = 0;
  const std::uint64_t most = table.size() / allocation_record_size;
  for (const auto& p : pools) {
    if (p.allocation_count > most || count > most)
      throw decode_error("the allocation table is shorter than the counts");
    count += p.allocation_count;
  }
  if (count * allocation_record_size != table.size())
    throw decode_error("the allocation table holds " + std::to_string(table.size()) + " bytes, expected " +
                       std::to_string(count * allocation_record_size) + " (" + std::to_string(count) + " records)");
  const auto* at = reinterpret_cast<const unsigned char*>(table.data());
  for (std::size_t i = 0; i < pools.size(); ++i) {
    auto& p = pools[i];
    p.allocations.clear();
    p.allocations.reserve(p.allocation_count);
    for (std::uint64_t k = 0; k < p.allocation_count; ++k, at += allocation_record_size) {
      const allocation_record rec = get_allocation_record(at);
      const auto api = alloc_api_from_value(rec.api);
      if (!api || rec.reserved != 0)
        throw decode_error("pools[" + std::to_string(i) + "].allocations[" + std::to_string(k) +
                           "]: not a valid allocation record (API " + std::to_string(rec.api) + ")");
      p.allocations.push_back({rec.addr, rec.size, *api});
    }
  }
}

// ---- examples ----
namespace {

hello_reply example_hello(const device_description& device) {
  return hello_reply{protocol::version,
                     4242,
                     {"python", "train.py"},
                     process_state::suspended,
                     "/dev/shm/vmmckpt-1000/suspend-4242-20261123-101500",
                     {device},
                     {{0, 0x200000000000, 549755813888, 1073741824, 12, 1140850688, false},
                      {0, 0x300000000000, 2199023255552, 20971520, 1, 20971520, true}},
                     {{std::string(not_owned_kind::managed), 67108864}}};
}

// The program's own VMM memory: one reservation, and one handle of 20 MiB mapped at its start.
vmm_layout example_vmm_layout() {
  vmm_layout layout;
  layout.next_token = 2;
  layout.reservations = {{0x300000000000, 21474836480, 0}};
  vmm_handle handle;
  handle.token = vmm_token_tag | 1;
  handle.size = 20971520;
  handle.refs = 1;
  handle.properties.bytes[0] = 1;  // CU_MEM_ALLOCATION_TYPE_PINNED
  handle.properties.bytes[4] = 1;  // requestedHandleTypes: POSIX FD
  handle.properties.bytes[8] = 1;  // CU_MEM_LOCATION_TYPE_DEVICE, id 0
  layout.handles = {handle};
  layout.mappings = {{0x300000000000, 20971520, handle.token, 0}};
  layout.access = {{0x300000000000, 20971520, {{1, 0, 3}}}};
  return layout;
}

// A pool of one block, and one VMM mapping of 20 MiB as PyTorch's expandable segments make them.
dump_begin_reply example_held(const device_description& device) {
  dump_begin_reply held{
      3,
      std::chrono::milliseconds(30'000),
      {device},
      {{0,
        0x200000000000,
        549755813888,
        2097152,
        1,
        {{0x200000000000, 4096, vmmckpt::alloc_api::cuda_malloc}},
        {{0x200000000000, 67108864}},
        false},
       {0,
        0x300000000000,
        2199023255552,
        2097152,
        1,
        {{0x300000000000, 20971520, vmmckpt::alloc_api::cu_mem_map}},
        {},
        true}},
      std::nullopt,
      {{std::string(not_owned_kind::managed), 67108864}, {std::string(not_owned_kind::arrays), 1048576}},
      {{4243, 0x200004000000, 67108864, 0x500000000000, device.uuid}}};
  held.vmm = example_vmm_layout();
  return held;
}

}  // namespace

std::vector<example> example_messages() {
  const device_description h200{0, "NVIDIA H200", "GPU-2f6c1d3e-8a41-4b7e-9c55-0d1e2f3a4b5c", 9, 0};
  const hello_reply hello = example_hello(h200);
  const dump_begin_reply held = example_held(h200);
  const comm_count cut_comm{0x5c1e8f0a3d2b4e71, 0, 2, 1207, {{1, 3}}, {{1, 3}}};
  const comm_count cut_target{0x5c1e8f0a3d2b4e71, 0, 0, 1208, {{1, 3}}, {{1, 3}}};
  std::vector<example> examples{
      {op::hello, encode(request{hello_request{true}}), encode(hello)},
      {op::dump_begin,
       encode(request{dump_begin_request{
           std::chrono::milliseconds(30'000), 1795430130000, true,
           job_suspend{"/images/job1", "/images/job1/4242", "0123456789abcdef0123456789abcdef", {4242, 4243}}}}),
       encode(held)},
      {op::dump_end, encode(request{dump_end_request{}}), encode(dump_end_reply{183000})},
      {op::suspend,
       encode(request{suspend_request{"/dev/shm/vmmckpt-1000/suspend-4242-20261123-101500",
                                      "0123456789abcdef0123456789abcdef", 1795430250000}}),
       encode(suspend_reply{8657043456, 6200000, {{0, 1107689472}}})},
      {op::resume,
       encode(request{
           resume_request{1795431000000, true, "/images/job1/gpu/4242", resume_request::stage::load, {4242, 4243}}}),
       encode(resume_reply{8593080320, 3.83, "/dev/shm/vmmckpt-1000/suspend-4242-20261123-101500"})},
      {op::check, encode(request{check_request{}}),
       encode(check_reply{false, {"device 0: block at 0x200000000000 has no physical memory"}})},
      {op::ipc_open, encode(request{ipc_open_request{0x200004000000, 3}}),
       encode(ipc_open_reply{h200.uuid, 2097152, {{0, 67108864}, {67108864, 4194304}}})},
      {op::ipc_close, encode(request{ipc_close_request{0x200004000000, 3}}), encode(ipc_close_reply{})},
      {op::vmm_identify, encode(request{vmm_identify_request{}}),
       encode(vmm_share_reply{vmm_token_tag | 7, 4194304, h200.uuid})},
      {op::vmm_share, encode(request{vmm_share_request{vmm_token_tag | 7}}),
       encode(vmm_share_reply{vmm_token_tag | 7, 4194304, h200.uuid})},
      {op::vmm_unshare, encode(request{vmm_unshare_request{vmm_token_tag | 7}}), encode(vmm_unshare_reply{})},
      {op::cut_arm, encode(request{cut_arm_request{std::chrono::milliseconds(60'000), 1795430130000}}),
       encode(cut_status{true, 1, 0, "ncclAllReduce", {cut_comm}})},
      {op::cut_targets, encode(request{cut_targets_request{{cut_target}, true}}),
       encode(cut_status{true, 0, 1, "", {cut_comm}})},
      {op::cut_release, encode(request{cut_release_request{}}), encode(cut_status{false, 0, 0, "", {cut_comm}})},
  };
  for (example& e : peek_examples(h200)) examples.push_back(std::move(e));
  return examples;
}

std::string example_failure() { return encode(failure_reply{refusal::not_suspended, "the program is not suspended"}); }
std::string example_fds_frame() { return encode(fds_frame{250}); }
std::string example_progress_frame() { return encode(progress_frame{1073741824, 8593080320}); }

}  // namespace vmmckpt::control
