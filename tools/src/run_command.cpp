// `cuda-ckpt run`: start a command with libvmmckpt.so preloaded.
#include "commands.hpp"
#include "cli_options.hpp"
#include "run_command.hpp"
#include "io_uring_refusal.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>

#include "exit_codes.hpp"

namespace vmmckpt::tools {
namespace {
struct sigaction inherited_file_size_action {};
bool file_size_signal_changed = false;
}  // namespace

void ignore_file_size_signal() {
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  file_size_signal_changed = ::sigaction(SIGXFSZ, &ignore, &inherited_file_size_action) == 0;
}

std::vector<std::string> shim_candidates() {
  if (const char* explicit_path = std::getenv("VMMCKPT_SHIM"); explicit_path && *explicit_path) return {explicit_path};
  // /proc/self/exe is the real path, so a symlink to cuda-ckpt (say in ~/bin) still finds its prefix.
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return {};
  const auto bin_dir = self.parent_path();
  std::vector<std::string> candidates;
  for (const char* lib_dir : {"../lib", VMMCKPT_BIN_TO_LIBDIR, "../lib/" VMMCKPT_LIBRARY_ARCH}) {
    auto path = (bin_dir / lib_dir / "libvmmckpt.so").lexically_normal().string();
    if (std::find(candidates.begin(), candidates.end(), path) == candidates.end()) candidates.push_back(path);
  }
  return candidates;
}

std::string locate_shim() {
  for (const auto& path : shim_candidates())
    if (::access(path.c_str(), R_OK) == 0) return path;
  return {};
}

int run_under_shim(const std::vector<std::string>& command, const char* subcommand) {
  if (command.empty()) {
    std::cerr << "cuda-ckpt " << subcommand << ": no command given (usage: cuda-ckpt run [--] COMMAND [ARGS...])\n";
    return exit_usage;
  }
  const std::string shim = locate_shim();
  if (shim.empty()) {
    std::cerr << "cuda-ckpt " << subcommand << ": cannot find the shim libvmmckpt.so; looked at:";
    for (const auto& path : shim_candidates()) std::cerr << " '" << path << "'";
    std::cerr << " (set VMMCKPT_SHIM to its path)\n";
    return exit_failure;
  }
  // The shim goes first so its symbols win over any other preloaded library.
  std::string preload = shim;
  if (const char* existing = std::getenv("LD_PRELOAD"); existing && *existing) preload += std::string(":") + existing;
  ::setenv("LD_PRELOAD", preload.c_str(), 1);
  // libuv (PyTorch's TCPStore, which torchrun hosts) sets up io_uring rings, which CRIU cannot dump: without them a
  // job started here stays checkpointable whole (dump --job --process). A setting of the user's own wins. libuv
  // still makes one ring (to batch epoll_ctl) whatever it says, hence the refusal.
  ::setenv("UV_USE_IO_URING", "0", 0);
  if (const std::string why = refuse_io_uring(); !why.empty())
    std::cerr << "cuda-ckpt " << subcommand << ": " << why << ": CRIU cannot checkpoint a process that uses it\n";

  if (file_size_signal_changed) ::sigaction(SIGXFSZ, &inherited_file_size_action, nullptr);
  std::vector<char*> argv;
  argv.reserve(command.size() + 1);
  for (const auto& arg : command) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  ::execvp(argv[0], argv.data());
  const int error = errno;
  std::cerr << "cuda-ckpt " << subcommand << ": cannot execute '" << command[0] << "': " << std::strerror(error)
            << "\n";
  return error == ENOENT ? exit_not_found : exit_cannot_execute;
}

subcommand add_run(CLI::App& app) {
  auto* command = app.add_subcommand("run", "Run a command with its device allocations served from the vmmckpt pool");
  command->footer(
      "Usage: cuda-ckpt run [--] COMMAND [ARGS...]\n"
      "Sets LD_PRELOAD to libvmmckpt.so ($VMMCKPT_SHIM, else found in ../lib, the install's library directory\n"
      "or ../lib/<multiarch> next to cuda-ckpt's real directory) and executes the command. Also sets\n"
      "UV_USE_IO_URING=0 unless set, and makes io_uring_setup fail with ENOSYS in the command (a seccomp filter;\n"
      "without CAP_SYS_ADMIN with no_new_privs set): CRIU cannot dump an io_uring, which libuv (PyTorch's TCPStore)\n"
      "makes otherwise. VMMCKPT_ALLOW_IO_URING=1 leaves io_uring alone.\n"
      "Example: cuda-ckpt run -- python train.py --epochs 3");
  command->prefix_command();  // everything after the first word belongs to the command

  return {command, [command] { return run_under_shim(command->remaining()); }};
}

}  // namespace vmmckpt::tools
