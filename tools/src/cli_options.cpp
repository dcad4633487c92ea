#include "cli_options.hpp"

namespace vmmckpt::tools {

const CLI::Validator process_id(
    [](std::string& text) -> std::string {
      const bool digits = !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
      if (!digits || text.size() > 9 || std::stol(text) <= 0)
        return "a process id is a positive integer, not '" + text + "'";
      return {};
    },
    "");

namespace {

const CLI::Validator whole_seconds(
    [](std::string& text) -> std::string {
      const bool digits = !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
      if (!digits) return "takes whole seconds (an integer from 1 to 3600), not '" + text + "'";
      if (text.size() > 4 || std::stoi(text) < 1 || std::stoi(text) > 3600)
        return "takes whole seconds from 1 to 3600, not " + text;
      return {};
    },
    "INT in [1 - 3600]");

}  // namespace

CLI::Option* add_hold_deadline(CLI::App* command, std::chrono::seconds& hold_deadline, const std::string& help) {
  return command
      ->add_option_function<int>(
          "--deadline", [&hold_deadline](int seconds) { hold_deadline = std::chrono::seconds(seconds); }, help)
      ->default_str(std::to_string(hold_deadline.count()))
      ->check(whole_seconds)
      ->type_name("INT");
}

void add_pid(CLI::App* command, pid_t& pid, const std::string& what, const std::vector<const CLI::Option*>& instead) {
  auto* positional = command->add_option("pid", pid, what + "; or -t PID")->check(process_id)->type_name("PID");
  auto* flag = command->add_option("-t,--pid", pid, "The same, as CRIU and cuda-checkpoint spell it")
                   ->check(process_id)
                   ->type_name("PID");
  command->parse_complete_callback([positional, flag, instead] {
    const std::size_t given = positional->count() + flag->count();
    for (const CLI::Option* other : instead) {
      if (other->count() == 0) continue;
      if (given > 0) throw CLI::ValidationError(other->get_name() + " names the job's processes: no PID besides");
      return;
    }
    if (given == 0) throw CLI::RequiredError("a process: PID, or -t PID");
    if (given > 1) throw CLI::ValidationError("one process: PID, or -t PID, not both");
  });
}

const CLI::Option* add_job(CLI::App* command, job_command_options& o, const std::string& what) {
  command->add_flag("--job", o.job,
                    what + " the whole multi-rank job PID belongs to: every process under vmmckpt in PID's tree "
                           "(PID: the launcher, torchrun or mpirun or a Slurm step), brought to one point of the "
                           "job first (docs/job-checkpoint.md)");
  return command->add_option("--ranks", o.ranks, "The job's processes, named (PID,PID,...), instead of a launcher")
      ->delimiter(',')
      ->check(process_id)
      ->type_name("PID,...");
}

CLI::Option* add_image(CLI::App* command, std::string& path) {
  return command->add_option("image,-D", path, "Image directory")->required()->type_name("DIR");
}

void add_held_image(CLI::App* command, held_image_options& o, const std::string& output_help,
                    const std::string& deadline_help) {
  const bool dump = command->get_name() == "dump";
  std::vector<const CLI::Option*> instead{add_job(command, o, dump ? "Dump" : "Suspend")};
  if (dump) {
    instead.push_back(command
                          ->add_option("--nodes", o.nodes,
                                       "A job across nodes: the agent of each (`cuda-ckpt job-agent`), HOST:PORT,... "
                                       "Every node writes its ranks' images in DIR there (docs/job-checkpoint.md)")
                          ->delimiter(',')
                          ->type_name("HOST:PORT,..."));
    command->add_option("--token-file", o.token_file, "With --nodes: the file holding the job's secret, as the agents'")
        ->type_name("FILE");
  }
  add_pid(command, o.pid, "The process (running under vmmckpt)", instead);
  command->add_option("-o,--output,-D", o.output, output_help)->type_name("DIR");
  command->add_flag("--json", o.json, "Print the result as JSON");
  add_hold_deadline(command, o.hold_deadline, deadline_help);
}

}  // namespace vmmckpt::tools
