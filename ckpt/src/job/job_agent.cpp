// cuda-ckpt job-agent: a node's part of a job across nodes. It takes a coordinator's operation on its node's
// ranks (each held and copied out here, at the coordinator's steps) and relays the coordinator's cut connections
// to those ranks' control servers.
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <functional>
#include <mutex>
#include <set>
#include <thread>

#include "base/image_files.hpp"
#include "job/job_run.hpp"
#include "job/node_link.hpp"
#include "job/rendezvous.hpp"
#include "vmmckpt/ckpt/job_image.hpp"
#include "vmmckpt/ckpt/job_nodes.hpp"
#include "vmmckpt/ckpt/errors.hpp"
#include "vmmckpt/ckpt/control_client.hpp"
#include "vmmckpt/image/image.hpp"
#include "vmmckpt/protocol/protocol.hpp"
#include "vmmckpt/image/staging_name.hpp"

namespace vmmckpt::ckpt {
namespace fs = std::filesystem;
namespace {

using std::chrono::milliseconds;

// What the connections of one agent share: the operation in progress, whose ranks alone a relay may reach, for
// as long as that operation lasts (`serial` counts the operations).
struct agent_state {
  std::mutex mutex;
  bool busy = false;
  std::uint64_t serial = 0;
  std::set<pid_t> ranks;

  bool in_operation(std::uint64_t operation, pid_t pid) {
    std::lock_guard lock(mutex);
    return busy && serial == operation && ranks.count(pid) != 0;
  }
};

struct operation_claim {
  agent_state& state;
  explicit operation_claim(agent_state& s) : state(s) {
    std::lock_guard lock(state.mutex);
    if (state.busy) throw tool_error("this node's agent is busy with another operation on its job");
    state.busy = true;
    ++state.serial;
  }
  ~operation_claim() {
    std::lock_guard lock(state.mutex);
    state.busy = false;
    state.ranks.clear();
  }
  operation_claim(const operation_claim&) = delete;
  operation_claim& operator=(const operation_claim&) = delete;
};

// An unsigned integer field of `from`, from lo to hi.
std::uint64_t bounded(const nlohmann::json& from, const char* key, std::uint64_t lo, std::uint64_t hi) {
  const auto& v = from.at(key);
  const bool whole = v.is_number_unsigned() || (v.is_number_integer() && v.get<std::int64_t>() >= 0);
  if (!whole || v.get<std::uint64_t>() < lo || v.get<std::uint64_t>() > hi)
    throw tool_error(std::string(key) + ": " + std::to_string(lo) + " to " + std::to_string(hi) + " expected");
  return v.get<std::uint64_t>();
}

// The coordinator's copy settings ("copy"), checked as the command line checks its own.
copy_settings copy_of(const nlohmann::json& request, const std::atomic<int>* stop) {
  const auto& c = request.at("copy");
  copy_settings copy;
  copy.chunk_bytes = bounded(c, "chunk_bytes", 1u << 20, 1u << 30);
  copy.staging_bytes = bounded(c, "staging_bytes", 0, UINT64_MAX);
  copy.pinned_bytes = bounded(c, "pinned_bytes", 0, UINT64_MAX);
  copy.streams = static_cast<int>(bounded(c, "streams", 1, 16));
  copy.writers = static_cast<int>(bounded(c, "writers", 1, 256));
  copy.gpu_checksums = c.value("gpu_checksums", true);
  copy.interrupt = stop;  // the agent stopped by SIGINT or SIGTERM: its dumps end cleanly, the ranks released
  return copy;
}

milliseconds bounded_ms(const nlohmann::json& request, const char* key) {
  return milliseconds(bounded(request, key, 1, 3'600'000));  // 1 ms to 1 h
}

// Writes all of `bytes` to a non-blocking fd; false when the peer went away or stopped reading for a second.
bool write_all(int fd, const char* bytes, std::size_t size) {
  while (size > 0) {
    const ssize_t n = ::send(fd, bytes, size, MSG_NOSIGNAL);
    if (n > 0) {
      bytes += n;
      size -= static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    pollfd p{fd, POLLOUT, 0};
    if (n < 0 && errno == EAGAIN && ::poll(&p, 1, 1000) > 0) continue;
    return false;
  }
  return true;
}

// Passes the coordinator's next frame on to the rank when it is a request of the cut, cut_arm's validity
// restamped by this host's clock (the nodes' clocks may differ by more than a deadline); false for anything
// else, which ends the relay: a coordinator reaches a rank for its cut, and for nothing else.
bool pass_cut_request(int tcp, int rank, std::int64_t clock_offset_ms) {
  std::string payload;
  std::vector<int> fds;
  protocol::failure error;
  if (!protocol::recv_frame(tcp, payload, fds, 1000, error)) return false;
  protocol::close_all(fds);
  auto decoded = control::decode_request(payload);
  auto* request = std::get_if<control::request>(&decoded);
  if (request == nullptr) return false;
  if (auto* arm = std::get_if<control::cut_arm_request>(request)) {
    arm->valid_until_ms += clock_offset_ms;
    payload = control::encode(*request);
  } else if (!std::holds_alternative<control::cut_targets_request>(*request) &&
             !std::holds_alternative<control::cut_release_request>(*request)) {
    return false;
  }
  return protocol::send_frame(rank, payload, {}, 1000, error);
}

// The cut's requests to the rank and its answers back, until either side closes, the operation ends or
// `until` passes (the rank's arming has lapsed by then).
void relay(int tcp, int rank, std::int64_t clock_offset_ms, const std::function<bool()>& still_on, deadline until) {
  char chunk[16384];
  while (!until.expired() && still_on()) {
    pollfd fds[2] = {{tcp, POLLIN, 0}, {rank, POLLIN, 0}};
    if (::poll(fds, 2, 200) < 0 && errno != EINTR) return;
    if (fds[0].revents != 0 && !pass_cut_request(tcp, rank, clock_offset_ms)) return;
    if (fds[1].revents == 0) continue;
    const ssize_t n = ::recv(rank, chunk, sizeof chunk, 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n <= 0 || !write_all(tcp, chunk, static_cast<std::size_t>(n))) return;
  }
}

// A coordinator's connection to one rank of the operation in progress: checked here as the tool checks any
// process it connects to, then relayed for as long as the operation lasts.
void serve_rank(node_link& link, const nlohmann::json& request, agent_state& state) {
  const auto& pid_field = request.at("pid");
  if (!pid_field.is_number_integer()) throw tool_error("pid: an integer expected");
  const auto pid = pid_field.get<pid_t>();
  const auto until = deadline::in(bounded_ms(request, "for_ms"));
  std::uint64_t operation = 0;
  {
    std::lock_guard lock(state.mutex);
    if (!state.busy || state.ranks.count(pid) == 0)
      throw tool_error("process " + std::to_string(pid) + " is no rank of an operation in progress on this node");
    operation = state.serial;
  }
  const auto& clock_field = request.at("clock_ms");
  if (!clock_field.is_number_integer()) throw tool_error("clock_ms: an integer expected");
  const std::int64_t clock_offset_ms = control::unix_ms_now() - clock_field.get<std::int64_t>();
  control_client rank(pid, until);
  link.send({{"step", "connected"}}, until);
  std::string unread;
  const int tcp = link.release(unread);
  // The coordinator sends nothing before it reads "connected".
  if (unread.empty())
    relay(
        tcp, rank.fd(), clock_offset_ms, [&] { return state.in_operation(operation, pid); },
        deadline(until.at() + std::chrono::seconds(2)));
  ::close(tcp);
}

// Where a node writes its part: next to its final name, renamed at the coordinator's word. The job's directory
// goes again when the dump fails, if it was made here (and is empty).
struct node_part {
  std::filesystem::path output, final_name, staging;
  bool made_output = false;
  bool committed = false;

  node_part(const fs::path& job_dir, const std::string& node)
      : output(job_dir), final_name(job_dir / node), staging(image::staging_path(job_dir / node)) {
    std::error_code ec;
    made_output = fs::create_directories(output, ec);
    if (fs::exists(final_name, ec)) throw image::image_error(final_name.string() + " already exists");
    make_private_directory(staging);
  }
  ~node_part() {
    std::error_code ignored;
    if (committed) return;
    fs::remove_all(staging, ignored);
    if (made_output) fs::remove(output, ignored);  // only when empty
  }
  node_part(const node_part&) = delete;
  node_part& operator=(const node_part&) = delete;
};

// Every rank of the node held and copied out as dump --job does, between the coordinator's steps: prepared /
// cut, safe / release. The cut's figures, as the coordinator sent them, go into `cut`.
std::vector<dump_result> dump_ranks(node_link& link, const nlohmann::json& request, const std::vector<pid_t>& ranks,
                                    const fs::path& staging, const copy_settings& copy, milliseconds hold_deadline,
                                    nlohmann::json& cut) {
  const auto until = deadline::in(hold_deadline);
  rendezvous prepared(ranks.size(), [&] {
    link.send({{"step", "prepared"}}, until);
    cut = link.expect("cut", until);
  });
  rendezvous safe(ranks.size(), [&] {
    link.send({{"step", "safe"}}, until);
    link.expect("release", until);
  });
  std::vector<dump_result> dumps(ranks.size());
  run_per_rank(ranks, {&prepared, &safe}, [&](std::size_t i) {
    dump_options d;
    d.pid = ranks[i];
    d.output = staging / std::to_string(ranks[i]);
    d.hold_deadline = hold_deadline;
    d.copy = copy;
    d.gpu_snapshot = request.value("gpu_snapshot", true);
    d.allow_partial = request.value("allow_partial", false);
    d.before_hold = [&] { prepared.arrive_and_wait(); };
    d.before_release = [&] { safe.arrive_and_wait(); };
    dumps[i] = dump(d);
  });
  return dumps;
}

// The node's part of dump --nodes: its ranks dumped at the coordinator's steps, its job.json written, and the
// part renamed into place once the coordinator says every node's is written (written / commit).
void serve_dump(node_link& link, const nlohmann::json& request, const job_agent_options& o, agent_state& state) {
  operation_claim claim(state);
  const milliseconds hold_deadline = bounded_ms(request, "hold_deadline_ms");
  const copy_settings copy = copy_of(request, o.stop);
  const std::string node = request.at("node").get<std::string>();
  const fs::path output = request.at("output").get<std::string>();
  if (!image_files::plain_name(node) || !output.is_absolute())
    throw tool_error("node, output: a directory name and an absolute path expected");
  const auto ranks = job_members(o.job, member_state::running, member_wait_within(hold_deadline));
  {
    std::lock_guard lock(state.mutex);
    state.ranks.insert(ranks.begin(), ranks.end());
  }
  node_part part(output, node);
  link.send({{"step", "ranks"}, {"ranks", ranks}}, deadline::in(hold_deadline));
  nlohmann::json cut;
  const auto dumps = dump_ranks(link, request, ranks, part.staging, copy, hold_deadline, cut);

  job_image j;
  j.kind = "dump";
  j.root_pid = o.job.ranks.empty() ? o.job.root : 0;
  j.cut_seconds = cut.value("cut_seconds", 0.0);
  j.cut_rounds = cut.value("cut_rounds", 0);
  nlohmann::json written = nlohmann::json::array();
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const image::manifest& m = dumps[i].manifest;
    j.ranks.push_back({ranks[i], m.image_id});
    j.tool_version = m.tool_version;
    j.created = m.created;
    j.host = m.host;
    j.held_ms = std::max(j.held_ms, dumps[i].hold_ms);
    written.push_back({{"pid", ranks[i]}, {"bytes", m.data_bytes}, {"hold_ms", dumps[i].hold_ms}});
  }
  write_job_manifest(part.staging, j);
  link.send({{"step", "written"}, {"ranks", written}, {"host", j.host}}, deadline::in(std::chrono::seconds(30)));
  // Every other node writes meanwhile, for as long as its disk takes.
  link.expect("commit", deadline::in(std::chrono::hours(1)));
  image_files::commit_directory(part.staging, part.final_name);
  part.committed = true;
  link.send({{"step", "committed"}}, deadline::in(std::chrono::seconds(30)));
}

void serve(node_link link, const job_agent_options& o, agent_state& state) {
  const auto log = [&](const std::string& line) {
    if (o.log) o.log(link.peer() + ": " + line);
  };
  try {
    const nlohmann::json request = link.receive(deadline::in(std::chrono::seconds(10)));
    if (!same_token(request.value("token", std::string()), o.token))
      throw tool_error("refused: the connection did not open with the job's secret (--token-file)");
    const std::string op = request.value("op", std::string());
    if (op == "rank") {
      serve_rank(link, request, state);
    } else if (op == "dump") {
      log("dump of this node's ranks");
      serve_dump(link, request, o, state);
      log("dump done");
    } else {
      throw tool_error("unknown operation \"" + op + "\" (a coordinator of another cuda-ckpt version?)");
    }
  } catch (const std::exception& e) {
    log(e.what());
    try {
      if (link.fd() >= 0) link.send({{"error", e.what()}}, deadline::in(std::chrono::seconds(1)));
    } catch (const std::exception&) {
      // The coordinator is gone: nothing more to tell it.
    }
  }
}

}  // namespace

void run_job_agent(const job_agent_options& o) {
  // More than a node's ranks' relays and a few operations: a peer that opens connections without end is
  // turned away rather than given a thread each.
  constexpr std::size_t max_connections = 512;
  std::string bound;
  const int listener = listen_tcp(parse_node_address(o.listen), bound);
  if (o.listening) o.listening(bound);
  agent_state state;
  struct connection {
    int fd = -1;  // shut down when the agent stops, so that its thread ends at once
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done = std::make_shared<std::atomic<bool>>(false);
  };
  std::vector<connection> connections;
  while (o.stop == nullptr || o.stop->load() == 0) {
    // Those served already are joined as new ones come: a long-lived agent keeps no threads of old operations.
    std::erase_if(connections, [](connection& c) {
      if (!c.done->load()) return false;
      c.thread.join();
      return true;
    });
    pollfd p{listener, POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0) continue;
    sockaddr_storage from{};
    socklen_t len = sizeof from;
    const int fd = ::accept4(listener, reinterpret_cast<sockaddr*>(&from), &len, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOMEM) std::this_thread::sleep_for(milliseconds(100));
      continue;
    }
    if (connections.size() >= max_connections) {
      ::close(fd);
      continue;
    }
    connection c;
    c.fd = fd;
    try {
      c.thread = std::thread([&o, &state, fd, done = c.done, peer = peer_name(from)] {
        serve(node_link(fd, "the coordinator at " + peer), o, state);
        done->store(true);
      });
    } catch (const std::system_error&) {
      ::close(fd);  // no thread to be had now: the peer may try again
      continue;
    }
    connections.push_back(std::move(c));
  }
  ::close(listener);
  for (auto& c : connections)
    if (!c.done->load()) ::shutdown(c.fd, SHUT_RDWR);
  for (auto& c : connections) c.thread.join();
}

}  // namespace vmmckpt::ckpt
