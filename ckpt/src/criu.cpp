// Finding and running CRIU (4.0 or later) for the whole-process mode.
#include "vmmckpt/ckpt/criu.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

extern char** environ;

namespace vmmckpt::ckpt {
namespace {

constexpr const char* how_to_get =
    "CRIU 4.0 or later is needed for whole-process checkpoints (scripts/provision-criu.sh provisions it on "
    "Debian 12 without touching the system; point VMMCKPT_CRIU at the criu it prints, or put it on PATH)";

std::string find_on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path != nullptr ? path : "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    const std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return {};
}

// Runs argv with stdout and stderr into `output` (a file), stdin from /dev/null; returns the status.
int spawn_and_wait(const std::vector<std::string>& argv, const std::string& output) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, output.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t child = 0;
  const int failed = ::posix_spawn(&child, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (failed != 0) throw criu_unavailable(argv[0] + ": cannot be started: " + std::strerror(failed));
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

criu_tool find_criu() {
  criu_tool criu;
  const char* chosen = std::getenv("VMMCKPT_CRIU");
  if (chosen != nullptr && *chosen != '\0') {
    if (::access(chosen, X_OK) != 0)
      throw criu_unavailable(std::string("VMMCKPT_CRIU=") + chosen + " is not an executable file; " + how_to_get);
    criu.path = chosen;
  } else {
    criu.path = find_on_path("criu");
    if (criu.path.empty()) throw criu_unavailable(std::string("criu is not on PATH; ") + how_to_get);
  }
  char scratch[] = "/tmp/cuda-ckpt-criu-version-XXXXXX";
  const int fd = ::mkstemp(scratch);
  if (fd < 0) throw tool_error(std::string("cannot make a scratch file in /tmp: ") + std::strerror(errno));
  ::close(fd);
  const int status = spawn_and_wait({criu.path, "--version"}, scratch);
  std::ifstream in(scratch);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ::unlink(scratch);
  const auto at = text.find("Version: ");
  if (status != 0 || at == std::string::npos)
    throw criu_unavailable(criu.path + " --version failed (exit " + std::to_string(status) + "): " +
                           text.substr(0, 200) + "; " + how_to_get);
  criu.version = text.substr(at + 9, text.find('\n', at) - at - 9);
  if (std::atoi(criu.version.c_str()) < criu_min_major)
    throw criu_unavailable(criu.path + " is CRIU " + criu.version + ", too old; " + how_to_get);
  return criu;
}

int run_criu(const criu_tool& criu, const std::vector<std::string>& args, const std::filesystem::path& log) {
  std::vector<std::string> argv{criu.path};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.insert(argv.end(), {"--log-file", std::filesystem::absolute(log).string(), "-v2"});
  return spawn_and_wait(argv, std::filesystem::absolute(log).string() + ".out");
}

std::string criu_log_excerpt(const std::filesystem::path& log) {
  std::vector<std::string> errors, last;
  for (const auto& file : {log, std::filesystem::path(log.string() + ".out")}) {
    std::ifstream in(file);
    for (std::string line; std::getline(in, line);) {
      if (line.find("Error") != std::string::npos) errors.push_back(line);
      last.push_back(line);
      if (last.size() > 5) last.erase(last.begin());
    }
  }
  const auto& chosen = errors.empty() ? last : errors;
  std::string out;
  for (std::size_t i = chosen.size() > 6 ? chosen.size() - 6 : 0; i < chosen.size(); ++i) out += "\n  " + chosen[i];
  return out;
}

}  // namespace vmmckpt::ckpt
