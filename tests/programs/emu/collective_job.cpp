// Emulator test program: the launcher of a multi-rank NCCL job, as torchrun is: it starts the ranks
// (emu_collective_rank, next to this program) and waits for them. It uses no CUDA itself, unless --count-gpus: it
// then initializes the driver and counts the devices first (prints `gpus N`), as torchrun's Python does.
//
//   emu_collective_job DIR NRANKS STEPS [--step-ms MS] [--count-gpus]
//
// It makes DIR (and removes a DIR/uid left by an earlier job, which would send the ranks to a job that is gone), forks
// NRANKS children that exec `emu_collective_rank DIR RANK NRANKS STEPS [--step-ms MS]` with its environment (an
// LD_PRELOAD'ed shim reaches them), prints `job PID` and `rank R PID`, forwards SIGTERM and SIGINT to the ranks, and
// exits 0 when every rank exited 0. Otherwise it prints `rank R failed: exit N` (or `signal N`), stops the other ranks
// with SIGTERM, as torchrun does (their peers would wait for the failed rank forever), and exits 1.
#include <cuda.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

constexpr int max_ranks = 64;
pid_t g_ranks[max_ranks];  // read by the signal handler; written before it is installed
int g_nranks = 0;

void forward(int sig) {
  for (int r = 0; r < g_nranks; ++r)
    if (g_ranks[r] > 0) kill(g_ranks[r], sig);
}

std::string own_directory() {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : self.parent_path().string();
}

// The child: dies with the launcher (a test that kills the launcher leaves no rank behind), takes back the signals
// the launcher blocked, and becomes the rank.
[[noreturn]] void become_rank(const std::string& program, std::vector<std::string> args, const sigset_t& old_mask,
                              pid_t launcher) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != launcher) _exit(127);
  sigprocmask(SIG_SETMASK, &old_mask, nullptr);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  execv(program.c_str(), argv.data());
  std::fprintf(stderr, "cannot run %s: %s\n", program.c_str(), std::strerror(errno));
  _exit(127);
}

int reap(int nranks) {
  int failed = 0;
  for (int left = nranks; left > 0;) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      break;
    }
    int rank = 0;
    while (rank < nranks && g_ranks[rank] != pid) ++rank;
    if (rank == nranks) continue;
    --left;
    g_ranks[rank] = -1;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) continue;
    if (WIFEXITED(status))
      std::printf("rank %d failed: exit %d\n", rank, WEXITSTATUS(status));
    else
      std::printf("rank %d failed: signal %d\n", rank, WTERMSIG(status));
    std::fflush(stdout);
    if (failed++ == 0) forward(SIGTERM);
  }
  return failed == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s DIR NRANKS STEPS [--step-ms MS] [--count-gpus]\n", argv[0]);
    return 2;
  }
  const fs::path dir = argv[1];
  const int nranks = std::atoi(argv[2]);
  if (nranks < 1 || nranks > max_ranks) {
    std::fprintf(stderr, "NRANKS must be 1 to %d\n", max_ranks);
    return 2;
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  fs::remove(dir / "uid", ec);
  fs::remove(dir / "uid.tmp", ec);
  const std::string program = own_directory() + "/emu_collective_rank";
  std::printf("job %d\n", static_cast<int>(getpid()));
  std::vector<std::string> forwarded_args;  // the rank's options: all but the launcher's own
  for (int i = 4; i < argc; ++i) {
    if (std::strcmp(argv[i], "--count-gpus") != 0) {
      forwarded_args.emplace_back(argv[i]);
      continue;
    }
    int count = 0;
    if (cuInit(0) != CUDA_SUCCESS || cuDeviceGetCount(&count) != CUDA_SUCCESS) {
      std::fprintf(stderr, "cannot count the GPUs\n");
      return 2;
    }
    std::printf("gpus %d\n", count);
  }
  std::fflush(stdout);

  // The signals wait until every rank's pid is known, so that the handler forwards them to all.
  sigset_t forwarded, old_mask;
  sigemptyset(&forwarded);
  sigaddset(&forwarded, SIGTERM);
  sigaddset(&forwarded, SIGINT);
  sigprocmask(SIG_BLOCK, &forwarded, &old_mask);
  for (int r = 0; r < nranks; ++r) {
    std::vector<std::string> args = {program, dir.string(), std::to_string(r), argv[2], argv[3]};
    args.insert(args.end(), forwarded_args.begin(), forwarded_args.end());
    const pid_t launcher = getpid();
    const pid_t pid = fork();
    if (pid == 0) become_rank(program, args, old_mask, launcher);
    if (pid < 0) {
      std::fprintf(stderr, "fork failed: %s\n", std::strerror(errno));
      break;
    }
    g_ranks[r] = pid;
    g_nranks = r + 1;
    std::printf("rank %d %d\n", r, static_cast<int>(pid));
    std::fflush(stdout);
  }
  struct sigaction action {};
  action.sa_handler = forward;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  sigprocmask(SIG_SETMASK, &old_mask, nullptr);
  if (g_nranks < nranks) forward(SIGTERM);  // the ranks started would wait for the others forever
  const int code = reap(g_nranks);
  return g_nranks == nranks ? code : 1;
}
