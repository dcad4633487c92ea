// cuda-ckpt dump --nodes: a job across nodes dumped through each node's agent. The coordinator takes the cut over
// every rank of every node (through the agents' relays) and paces the nodes' steps; each node holds and copies out
// its own ranks and writes its part of the image there.
#include "base/image_files.hpp"
#include "job/cut_coordinator.hpp"
#include "job/job_run.hpp"
#include "job/node_link.hpp"
#include "channel/session.hpp"
#include "vmmckpt/ckpt/job_image.hpp"
#include "vmmckpt/ckpt/job_nodes.hpp"
#include "vmmckpt/ckpt/errors.hpp"
#include "vmmckpt/image/image.hpp"
#include "vmmckpt/support/version.hpp"

namespace vmmckpt::ckpt {
namespace fs = std::filesystem;
namespace {

using clock = node_link::clock;

struct node_connection {
  node_address address;
  std::string name;
  node_link link;
};

// A connection to one rank of node n, relayed by its agent, for the cut.
std::unique_ptr<control_client> rank_through(const node_connection& n, pid_t pid, const std::string& token,
                                             deadline until) {
  node_link relay = node_link::connect(n.address, until, n.link.peer());
  relay.send({{"op", "rank"},
              {"token", token},
              {"pid", pid},
              {"for_ms", until.remaining_ms(1)},
              {"clock_ms", control::unix_ms_now()}},
             until);
  relay.expect("connected", until);
  std::string unread;
  const int fd = relay.release(unread);
  auto client = std::make_unique<control_client>(pid, fd, n.link.peer(), until);
  if (!unread.empty()) throw tool_error(n.link.peer() + " sent more than it was asked for");
  return client;
}

// Each agent asked for its part of the dump as soon as it is reached (an agent waits 10 s for a request), then
// its ranks known, and every one prepared for the hold. `nodes` holds every link made, for abandon() to wait on.
void start_nodes(const nodes_dump_options& o, nodes_dump_result& r, std::vector<node_connection>& nodes,
                 deadline until) {
  for (std::size_t i = 0; i < o.nodes.size(); ++i) {
    const node_address address = parse_node_address(o.nodes[i]);
    const std::string name = "node-" + std::to_string(i);
    nodes.push_back({address, name, node_link::connect(address, until, name + " (" + address.text() + ")")});
    r.nodes.push_back({name, address.text(), "", {}, 0, 0});
    nodes.back().link.send({{"op", "dump"},
                            {"token", o.token},
                            {"node", name},
                            {"output", r.image.string()},
                            {"hold_deadline_ms", o.hold_deadline.count()},
                            {"copy",
                             {{"chunk_bytes", o.copy.chunk_bytes},
                              {"staging_bytes", o.copy.staging_bytes},
                              {"pinned_bytes", o.copy.pinned_bytes},
                              {"streams", o.copy.streams},
                              {"writers", o.copy.writers},
                              {"gpu_checksums", o.copy.gpu_checksums}}},
                            {"gpu_snapshot", o.gpu_snapshot},
                            {"allow_partial", o.allow_partial}},
                           until);
  }
  for (std::size_t i = 0; i < nodes.size(); ++i)
    r.nodes[i].ranks = nodes[i].link.expect("ranks", until).at("ranks").get<std::vector<pid_t>>();
  for (auto& n : nodes) n.link.expect("prepared", until);
}

// After a failure: every agent told, by the links' closing, to release its ranks and remove its part; each is
// waited for (at most a few seconds in all), and then the job's directory goes when nothing is left in it.
void abandon(std::vector<node_connection>& nodes, const fs::path& image) noexcept {
  const auto closed_by = deadline::in(std::chrono::seconds(5));
  for (auto& n : nodes) n.link.wait_closed(closed_by);
  std::error_code ignored;
  fs::remove(image, ignored);
}

// The cut over every rank of every node; then every node holds its ranks, and they are released together once
// every node's bytes are safe (a rank released first would write into the others' memory).
cut_figures cut_and_hold(std::vector<node_connection>& nodes, const nodes_dump_result& r, const std::string& token,
                         deadline until) {
  std::vector<std::unique_ptr<control_client>> ranks;
  for (std::size_t i = 0; i < nodes.size(); ++i)
    for (const pid_t pid : r.nodes[i].ranks) ranks.push_back(rank_through(nodes[i], pid, token, until));
  cut_coordinator cut(std::move(ranks), until);
  const cut_figures figures = cut.bring_to_cut(until);
  for (auto& n : nodes)
    n.link.send({{"step", "cut"}, {"cut_seconds", figures.seconds}, {"cut_rounds", figures.rounds}}, until);
  for (auto& n : nodes) n.link.expect("safe", until);
  cut.release();
  for (auto& n : nodes) n.link.send({{"step", "release"}}, until);
  return figures;
}

// Every node's part written (as fast as its disk goes), then each renamed into place.
void write_and_commit(std::vector<node_connection>& nodes, nodes_dump_result& r) {
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    const auto written = nodes[i].link.expect("written", deadline::in(std::chrono::hours(1)));
    r.nodes[i].host = written.value("host", std::string());
    for (const auto& rank : written.at("ranks")) {
      r.nodes[i].bytes += rank.value("bytes", std::uint64_t{0});
      r.nodes[i].held_ms = std::max(r.nodes[i].held_ms, rank.value("hold_ms", 0.0));
    }
    r.held_ms = std::max(r.held_ms, r.nodes[i].held_ms);
  }
  std::string committed;
  try {
    for (auto& n : nodes) {
      n.link.send({{"step", "commit"}}, deadline::in(std::chrono::seconds(30)));
      n.link.expect("committed", deadline::in(std::chrono::seconds(30)));
      committed += (committed.empty() ? "" : ", ") + n.name;
    }
  } catch (const tool_error& e) {
    throw tool_error(std::string(e.what()) + (committed.empty() ? ""
                                                                : "; the parts of " + committed + " are in " +
                                                                      r.image.string() + " without job-nodes.json"));
  }
}

// job-nodes.json, last: the image is the job's from then on.
void write_manifest(const nodes_dump_result& r) {
  job_nodes_image j;
  j.kind = "dump";
  j.tool_version = VMMCKPT_VERSION;
  j.created = now_iso8601();
  j.host = hostname();
  j.cut_seconds = r.cut.seconds;
  j.cut_rounds = r.cut.rounds;
  j.held_ms = r.held_ms;
  for (const auto& n : r.nodes) j.nodes.push_back({n.name, n.address, n.host, n.ranks});
  try {
    write_job_nodes_manifest(r.image, j);
  } catch (const image::image_error& e) {
    throw image::image_error(std::string(e.what()) + "; every node's part is in " + r.image.string() +
                             " on its node, without job-nodes.json");
  }
}

}  // namespace

nodes_dump_result dump_job_nodes(const nodes_dump_options& o) {
  const auto start = clock::now();
  const deadline until(start + o.hold_deadline);
  if (o.nodes.empty()) throw tool_error("--nodes names no node");
  nodes_dump_result r;
  r.image = new_image_path(o.output);
  // Made here first: a directory this host cannot make fails the dump before any rank is touched.
  make_private_directory(r.image);
  std::vector<node_connection> nodes;
  try {
    start_nodes(o, r, nodes, until);
    r.cut = cut_and_hold(nodes, r, o.token, until);
    write_and_commit(nodes, r);
  } catch (...) {
    abandon(nodes, r.image);  // a part committed already stays, and the message says where
    throw;
  }
  write_manifest(r);
  r.seconds = std::chrono::duration<double>(clock::now() - start).count();
  return r;
}

}  // namespace vmmckpt::ckpt
