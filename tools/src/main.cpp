// cuda-ckpt: entry point, subcommands and exit codes.
#include <CLI/CLI.hpp>

#include <iostream>
#include <string_view>
#include <string>
#include <vector>

#include "exit_codes.hpp"
#include "run_command.hpp"
#include "version.hpp"

using namespace vmmckpt::tools;

namespace {

constexpr const char* exit_code_help =
    "Exit codes:\n"
    "  0    success\n"
    "  1    the operation failed (the message says why)\n"
    "  2    bad command line\n"
    "  126  run: the command cannot be executed\n"
    "  127  run: the command was not found\n"
    "  any other: run passes on the command's own exit status\n";

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"cuda-ckpt: deterministic-address checkpoint/restart for CUDA programs"};
  app.footer(exit_code_help);
  app.set_version_flag("--version", std::string("cuda-ckpt ") + VMMCKPT_VERSION);
  app.require_subcommand(1);

  auto* run = app.add_subcommand("run", "Run a command with its device allocations served from the vmmckpt pool");
  run->footer(
      "Usage: cuda-ckpt run [--] COMMAND [ARGS...]\n"
      "Sets LD_PRELOAD to libvmmckpt.so (found next to cuda-ckpt, or $VMMCKPT_SHIM) and executes the command.\n"
      "Example: cuda-ckpt run -- python train.py --epochs 3");
  run->prefix_command();  // everything after the first word belongs to the command

  // CLI11 would take a "--" right after "run" for itself; the command starts after it.
  std::vector<char*> args(argv, argv + argc);
  if (args.size() >= 3 && std::string_view(args[1]) == "run" && std::string_view(args[2]) == "--")
    args.erase(args.begin() + 2);

  try {
    app.parse(static_cast<int>(args.size()), args.data());
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? exit_ok : exit_usage;
  }

  if (*run) {
    // prefix_command leaves the command, untouched, in the remaining arguments.
    return run_under_shim(run->remaining());
  }
  return exit_usage;
}
