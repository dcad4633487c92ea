// A job whose ranks run on several nodes (docs/job-checkpoint.md, "Across nodes"): an agent on each node
// (`cuda-ckpt job-agent`) serves its node's ranks, and a coordinator (`cuda-ckpt dump --nodes`) cuts the whole
// job through them and has each node write its ranks' images there.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "vmmckpt/ckpt/job.hpp"
#include "vmmckpt/ckpt/deadlines.hpp"

namespace vmmckpt::ckpt {

// The job's shared secret in FILE: its first line, at least 16 characters. Refused (tool_error) when anyone but
// its owner may read or write the file, as ssh refuses a private key.
std::string read_token_file(const std::filesystem::path& file);

struct job_agent_options {
  job_spec job;        // this node's part of the job
  std::string listen;  // HOST:PORT (port 0: any free one)
  std::string token;   // the job's shared secret: a connection that does not open with it is refused
  std::function<void(const std::string& bound)> listening;  // told where it listens, once it does
  std::function<void(const std::string& line)> log;         // a line per request served and how it ended
  const std::atomic<int>* stop = nullptr;                   // nonzero: stop serving and return
};

// Serves coordinators until *stop: one operation at a time, and the connections it makes to the job's ranks for
// the cut. tool_error when it cannot listen.
void run_job_agent(const job_agent_options& options);

struct nodes_dump_options {
  std::vector<std::string> nodes;  // each node's agent, HOST:PORT; the nodes are named node-0, node-1, ... in order
  std::string token;
  std::filesystem::path output;  // the job's image directory: job-nodes.json here, each node's part in DIR/NODE
  copy_settings copy;            // each node copies out its ranks with these (not parent, interrupt nor reuse)
  std::chrono::milliseconds hold_deadline{default_dump_hold};
  bool gpu_snapshot = true;
  bool allow_partial = false;
};

struct nodes_dump_result {
  std::filesystem::path image;
  struct node {
    std::string name, address, host;
    std::vector<pid_t> ranks;
    std::uint64_t bytes = 0;
    double held_ms = 0;  // the longest any of its ranks was held
  };
  std::vector<node> nodes;
  cut_figures cut;
  double held_ms = 0;
  double seconds = 0;
};

// dump --job across nodes: every node's ranks prepared, the cut taken over all of them, each node's ranks held and
// copied out on their node, released together once every node's bytes are safe. The nodes' parts are renamed into
// place only once all are written, and job-nodes.json last. Throws tool_error naming the node (and rank) that
// failed; every rank then goes on.
nodes_dump_result dump_job_nodes(const nodes_dump_options& options);

}  // namespace vmmckpt::ckpt
