// A job across nodes: `cuda-ckpt job-agent` on each node, `cuda-ckpt dump --nodes` from anywhere, and inspect and
// verify of the image it writes (docs/job-checkpoint.md, "Across nodes").
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli_options.hpp"
#include "commands.hpp"
#include "exit_codes.hpp"
#include "interrupts.hpp"
#include "output.hpp"
#include "vmmckpt/ckpt/job_image.hpp"
#include "vmmckpt/ckpt/job_nodes.hpp"
#include "vmmckpt/image/image.hpp"

namespace vmmckpt::tools {
namespace fs = std::filesystem;
namespace {

std::string token_of(const std::string& file) { return ckpt::read_token_file(file); }

// The node's part of the image, when it is on this host (each node writes its own there).
bool part_here(const std::string& image, const ckpt::job_nodes_image::node& n) {
  std::error_code ec;
  return fs::exists(fs::path(image) / n.name, ec);
}

std::string listed(const std::vector<std::string>& names) {
  std::string text;
  for (const auto& n : names) text += (text.empty() ? "" : ", ") + n;
  return text;
}


// A node of a job across nodes, as --json names it.
template <typename Node>
nlohmann::json node_json(const Node& n) {
  return {{"name", n.name}, {"address", n.address}, {"host", n.host}, {"ranks", n.ranks}};
}

}  // namespace

int dump_nodes_command(const dump_command_options& o, const ckpt::copy_settings& copy) {
  ckpt::nodes_dump_options options;
  options.copy = copy;
  options.nodes = o.nodes;
  options.token = token_of(o.token_file);
  options.output = o.output.empty() ? "vmmckpt-job-nodes-" + time_stamp() : o.output;
  options.hold_deadline = o.hold_deadline;
  options.gpu_snapshot = !o.no_gpu_snapshot;
  options.allow_partial = o.allow_partial;
  const auto r = ckpt::dump_job_nodes(options);
  std::uint64_t bytes = 0;
  std::size_t ranks = 0;
  for (const auto& n : r.nodes) {
    bytes += n.bytes;
    ranks += n.ranks.size();
  }
  if (o.json) {
    nlohmann::json nodes = nlohmann::json::array();
    for (const auto& n : r.nodes) {
      nodes.push_back(node_json(n));
      nodes.back()["bytes"] = n.bytes;
      nodes.back()["held_ms"] = n.held_ms;
    }
    std::cout << nlohmann::json{{"image", r.image.string()},
                                {"nodes", nodes},
                                {"bytes", bytes},
                                {"cut_seconds", r.cut.seconds},
                                {"cut_rounds", r.cut.rounds},
                                {"held_ms", r.held_ms},
                                {"seconds", r.seconds}}
                     .dump(2)
              << "\n";
    return exit_ok;
  }
  std::printf("dumped the job on %zu nodes (%zu ranks, %s of GPU memory) to %s in %.3f s\n", r.nodes.size(), ranks,
              human_bytes(bytes).c_str(), r.image.c_str(), r.seconds);
  std::printf("  the cut: %.1f ms to bring every rank to one point (%d round%s); ranks held at most %.1f ms\n",
              r.cut.seconds * 1000, r.cut.rounds, r.cut.rounds == 1 ? "" : "s", r.held_ms);
  for (const auto& n : r.nodes)
    std::printf("  %s (%s, host %s): %zu ranks, %s, held %.1f ms; its part in %s there\n", n.name.c_str(),
                n.address.c_str(), shown(n.host).c_str(), n.ranks.size(), human_bytes(n.bytes).c_str(), n.held_ms,
                (r.image / n.name).c_str());
  return exit_ok;
}

int inspect_job_nodes_command(const std::string& image, bool json) {
  const auto j = ckpt::read_job_nodes_image(image);
  if (json) {
    nlohmann::json nodes = nlohmann::json::array();
    for (const auto& n : j.nodes) {
      nodes.push_back(node_json(n));
      nodes.back()["image"] = (fs::path(image) / n.name).string();
      nodes.back()["here"] = part_here(image, n);
    }
    nlohmann::json out = job_image_json(image, j);
    out["nodes"] = nodes;
    std::cout << out.dump(2) << "\n";
    return exit_ok;
  }
  std::printf("image     %s: a job's image across %zu nodes (dump --nodes, written by vmmckpt %s)\n",
              shown(image).c_str(), j.nodes.size(), shown(j.tool_version).c_str());
  std::printf("created   %s, coordinated from %s; cut at one point in %.1f ms (%d round%s), held at most %.1f ms\n",
              shown(j.created).c_str(), shown(j.host).c_str(), j.cut_seconds * 1000, j.cut_rounds,
              j.cut_rounds == 1 ? "" : "s", j.held_ms);
  for (const auto& n : j.nodes)
    std::printf("  %s: host %s (agent %s), %zu ranks; its part %s\n", n.name.c_str(), shown(n.host).c_str(),
                shown(n.address).c_str(), n.ranks.size(),
                part_here(image, n) ? ("here: cuda-ckpt inspect " + (fs::path(image) / n.name).string()).c_str()
                                    : "on that node");
  return exit_ok;
}

int verify_job_nodes_command(const std::string& image, bool json) {
  const auto j = ckpt::read_job_nodes_image(image);
  std::vector<std::string> checked, elsewhere;
  for (const auto& n : j.nodes) {
    const fs::path part = fs::path(image) / n.name;
    if (!part_here(image, n)) {
      elsewhere.push_back(n.name);
      continue;
    }
    if (!ckpt::is_job_image(part))
      throw image::image_error(part.string() + ": no job's image (no job.json), but job-nodes.json names it");
    const auto node = ckpt::read_job_image(part);
    std::vector<pid_t> ranks;
    for (const auto& r : node.ranks) ranks.push_back(r.pid);
    if (ranks != n.ranks)
      throw image::image_error(part.string() + ": holds other ranks than job-nodes.json names for " + n.name);
    ckpt::verify_job_image(part, node, true);
    checked.push_back(n.name);
  }
  if (checked.empty())
    throw image::image_error("no node's part is on this host (" + listed(elsewhere) +
                             " are on their nodes): verify DIR there; nothing was checked");
  if (json) {
    std::cout
        << nlohmann::json{{"image", image}, {"ok", true}, {"job", true}, {"checked", checked}, {"elsewhere", elsewhere}}
               .dump(2)
        << "\n";
  } else {
    std::printf("%s: good (a job's image across %zu nodes: every checksum of %s matches", shown(image).c_str(),
                j.nodes.size(), listed(checked).c_str());
    if (elsewhere.empty())
      std::printf(")\n");
    else
      std::printf("; %s: on their nodes, verify there)\n", listed(elsewhere).c_str());
  }
  return exit_ok;
}

subcommand add_job_agent(CLI::App& app) {
  struct options {
    pid_t pid = 0;
    std::vector<pid_t> ranks;
    std::string listen;
    std::string token_file;
  };
  auto o = std::make_shared<options>();
  auto* command = app.add_subcommand(
      "job-agent", "Serve this node's part of a job across nodes to `cuda-ckpt dump --nodes` (until SIGINT/SIGTERM)");
  const CLI::Option* ranks =
      command->add_option("--ranks", o->ranks, "This node's ranks, named (PID,PID,...), instead of a launcher")
          ->delimiter(',')
          ->check(process_id)
          ->type_name("PID,...");
  add_pid(command, o->pid,
          "The job's launcher on this node (torchrun, mpirun, a Slurm step): its tree is the node's part", {ranks});
  command->add_option("--listen", o->listen, "Where coordinators connect, HOST:PORT (port 0: any free one, printed)")
      ->required()
      ->type_name("HOST:PORT");
  command
      ->add_option("--token-file", o->token_file,
                   "The job's secret, its first line (16 characters or more; readable by its owner only): a "
                   "connection that does not open with it is refused")
      ->required()
      ->type_name("FILE");
  command->footer("Prints `listening at HOST:PORT` once it listens, then a line on stderr for each operation served.\n"
                  "One operation at a time; each rank of this node is checked as any other command checks a process\n"
                  "(its owner, the shim in it) before a coordinator reaches it.");
  return {command, [o] {
            ckpt::job_agent_options a;
            a.job = {o->ranks.empty() ? o->pid : 0, o->ranks};
            a.listen = o->listen;
            a.token = token_of(o->token_file);
            a.stop = &catch_interrupts();
            a.listening = [](const std::string& bound) {
              std::printf("listening at %s\n", bound.c_str());
              std::fflush(stdout);
            };
            a.log = [](const std::string& line) {
              const std::time_t t = std::time(nullptr);
              char when[32];
              std::strftime(when, sizeof when, "%H:%M:%S", std::localtime(&t));
              std::fprintf(stderr, "%s job-agent: %s\n", when, line.c_str());
            };
            ckpt::run_job_agent(a);
            return exit_ok;
          }};
}

}  // namespace vmmckpt::tools
