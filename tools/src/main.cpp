// cuda-ckpt: entry point, subcommands and exit codes.
#include <CLI/CLI.hpp>

#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cli_options.hpp"
#include "commands.hpp"
#include "exit_codes.hpp"
#include "output.hpp"
#include "run_command.hpp"
#include "vmmckpt/ckpt/control_client.hpp"
#include "vmmckpt/ckpt/driver.hpp"
#include "vmmckpt/ckpt/errors.hpp"
#include "vmmckpt/support/descriptor_room.hpp"
#include "vmmckpt/image/image.hpp"
#include "vmmckpt/support/log.hpp"
#include "vmmckpt/support/version.hpp"

using namespace vmmckpt::tools;

namespace {

// Only the main help: where cuda-ckpt runs with no GPU driver (storage and login nodes, CI).
constexpr const char* driver_help =
    "dump, suspend and restore --device load the CUDA driver ($VMMCKPT_LIBCUDA, default libcuda.so.1);\n"
    "the other commands run without one.\n";

constexpr const char* exit_code_help =
    "Exit codes:\n"
    "  0    success (verify: the image is good; gc: also when it skipped entries it cannot read, named\n"
    "       with a warning)\n"
    "  1    the operation failed, or verify found a defect (the message says which)\n"
    "  2    bad command line\n"
    "  3    dump, suspend: refused, the process has device memory vmmckpt does not own (the message\n"
    "       names it); nothing was written and the process goes on (--allow-partial: write it anyway)\n"
    "  126  run: the command cannot be executed\n"
    "  127  run: the command was not found\n"
    "  130  dump, suspend: interrupted by SIGINT (143: SIGTERM); the unfinished image is removed and the\n"
    "       program goes on (suspend: not suspended)\n"
    "  any other: run passes on the command's own exit status\n";

// Whether the command line asks for JSON (before any "--"): failures are then reported as JSON too.
bool json_requested(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--") return false;
    if (arg == "--json") return true;
  }
  return false;
}

// What CLI11 does not say the usual way: an unknown command, and `help [COMMAND]`. The exit code when it
// answered the command line, nothing when the command line is for CLI11 to parse.
std::optional<int> answer_help_or_unknown(CLI::App& app, int argc, char** argv, bool json) {
  if (argc >= 2 && argv[1][0] != '-') {
    const std::string word = argv[1];
    if (word == "help") {
      if (argc == 2) {
        std::cout << app.help();
        return exit_ok;
      }
      CLI::App* command = nullptr;
      try {
        command = app.get_subcommand(argv[2]);
      } catch (const CLI::OptionNotFound&) {
      }
      if (command == nullptr)
        return report_failure("", false, std::string("unknown command '") + argv[2] + "'; see cuda-ckpt --help",
                              exit_usage);
      std::cout << command->help(app.get_name());
      return exit_ok;
    }
    bool known = false;
    for (const auto* command : app.get_subcommands([](CLI::App*) { return true; }))
      known |= command->get_name() == word;
    if (!known) return report_failure("", json, "unknown command '" + word + "'; see cuda-ckpt --help", exit_usage);
  }
  return std::nullopt;
}

// The kind of an operation's failure, for --json's "cause".
const char* cause_of(const vmmckpt::ckpt::tool_error& e) {
  namespace c = vmmckpt::ckpt;
  if (dynamic_cast<const c::no_such_process*>(&e) != nullptr) return "no_process";
  if (dynamic_cast<const c::not_under_vmmckpt*>(&e) != nullptr) return "not_under_vmmckpt";
  if (dynamic_cast<const c::no_control_server*>(&e) != nullptr) return "no_control_server";
  if (dynamic_cast<const c::criu_unavailable*>(&e) != nullptr) return "criu_unavailable";
  if (dynamic_cast<const c::other_rank_failed*>(&e) != nullptr) return "rank_failed";
  if (const auto* control = dynamic_cast<const c::control_error*>(&e))
    return control->refused ? "refused" : "unreachable";
  return "failed";
}

// Runs the subcommand the command line named; what it throws becomes a message and an exit code.
int run_parsed(const std::vector<subcommand>& commands, const std::string& command, bool json) {
  try {
    for (const subcommand& c : commands)
      if (*c.app) return c.run();
  } catch (const vmmckpt::ckpt::interrupted& e) {
    // By now the unfinished image is gone and the connection closed: the program goes on.
    return report_failure(command, json,
                          std::string(e.what()) + ": no image was written, and the program was released and goes on" +
                              (command == "suspend" ? ", not suspended" : ""),
                          128 + e.signal, "interrupted");
  } catch (const vmmckpt::ckpt::partial_refused& e) {
    return report_failure(
        command, json,
        "process " + std::to_string(e.pid) +
            " has device memory that vmmckpt does not own, which no image would hold: " + kinds_and_sizes(e.not_owned) +
            ". Nothing was written and the process goes on. Pass --allow-partial to write an image "
            "marked partial that lacks it.",
        exit_partial_refused, "partial_refused");
  } catch (const vmmckpt::ckpt::driver_unavailable& e) {
    return report_failure(command, json,
                          std::string(e.what()) + ". " + command +
                              " needs it; inspect, verify, cat, ps and gc do not (VMMCKPT_LIBCUDA names the library "
                              "to load, default libcuda.so.1)",
                          exit_failure, "driver_unavailable");
  } catch (const vmmckpt::ckpt::tool_error& e) {
    return report_failure(command, json, e.what(), exit_failure, cause_of(e));
  } catch (const vmmckpt::image::image_error& e) {
    return report_failure(command, json, e.what(), exit_failure, "image");
  } catch (const std::exception& e) {
    return report_failure(command, json, std::string("unexpected error: ") + e.what(), exit_failure);
  }
  return exit_usage;
}

// The program; main() makes sure that nothing it throws ends in std::terminate.
int cuda_ckpt(int argc, char** argv) {
  ignore_file_size_signal();
  // A dump receives a descriptor per exported piece of memory in the hold and keeps its parents' data
  // files open: the table grows now, while this process has one thread and growing costs nothing.
  vmmckpt::grow_descriptor_table(4096);
  CLI::App app{"cuda-ckpt: deterministic-address checkpoint/restart for CUDA programs", "cuda-ckpt"};
  app.footer(std::string(driver_help) + "\n" + exit_code_help);
  app.set_version_flag("--version", std::string("cuda-ckpt ") + VMMCKPT_VERSION);
  app.require_subcommand(1);

  // The command of restore is everything after its first "--": CLI11 parses only what comes before.
  std::vector<std::string> trailing_command;
  const std::vector<subcommand> commands{
      add_run(app),     add_ps(app),     add_check(app),     add_dump(app),
      add_merge(app),   add_rm(app),     add_inspect(app),   add_verify(app),
      add_cat(app),     add_gc(app),     add_peek(app),      add_poke(app),
      add_suspend(app), add_resume(app), add_job_agent(app), add_restore(app, trailing_command)};

  // Every command's help ends with the exit codes, as the program's does.
  for (auto* command : app.get_subcommands([](CLI::App*) { return true; })) {
    const std::string own = command->get_footer();
    command->footer(own.empty() ? exit_code_help : own + "\n\n" + exit_code_help);
  }

  const bool json = json_requested(argc, argv);
  if (const auto answered = answer_help_or_unknown(app, argc, argv, json)) return *answered;
  const std::string command = argc >= 2 && argv[1][0] != '-' ? argv[1] : "";
  // A misspelt VMMCKPT_LOG_LEVEL is said once, here; under run and restore the shim in the program says it.
  if (command != "run" && command != "restore") vmmckpt::log::threshold();

  // The command of run is everything after its first word (a "--" before it dropped).
  std::vector<char*> args(argv, argv + argc);
  if (command == "restore") {
    for (std::size_t i = 2; i < args.size(); ++i) {
      if (std::string_view(args[i]) == "--") {
        trailing_command.assign(args.begin() + static_cast<long>(i) + 1, args.end());
        args.resize(i);
        break;
      }
    }
  }
  if (args.size() >= 3 && command == "run" && std::string_view(args[2]) == "--") args.erase(args.begin() + 2);

  try {
    app.parse(static_cast<int>(args.size()), args.data());
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // As every other failure: `cuda-ckpt COMMAND: message`, and where to look for help.
    const std::string help = command.empty() ? "cuda-ckpt --help" : "cuda-ckpt help " + command;
    return report_failure(command, json, std::string(e.what()) + (json ? "" : "; see " + help), exit_usage);
  }
  return run_parsed(commands, command, json);
}

}  // namespace

int main(int argc, char** argv) {
  // What escapes the commands' own handling (setting up or parsing the command line) is a failure like any other,
  // not an abort.
  try {
    return cuda_ckpt(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "cuda-ckpt: unexpected error: " << e.what() << "\n";
  } catch (...) {
    std::cerr << "cuda-ckpt: unexpected error\n";
  }
  return exit_failure;
}
