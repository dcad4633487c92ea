// Security: the control socket's permissions, a client of another uid refused and logged, another uid that
// takes a program's addresses first or poses as it, and another user's gc over root's image and job and
// whole-process commands on root's program.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "process_support.hpp"
#include "vmmckpt/protocol/protocol.hpp"

using namespace vmmckpt::test;

TEST_CASE("the control directory is 0700 and the socket 0600", "[emu][security]") {
  auto program = start_writer();
  const std::string path = vmmckpt::protocol::socket_path(program->pid());
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  REQUIRE(S_ISSOCK(st.st_mode));
  REQUIRE((st.st_mode & 0777) == 0600);
  REQUIRE(::stat(vmmckpt::protocol::runtime_dir().c_str(), &st) == 0);
  REQUIRE((st.st_mode & 0777) == 0700);
  REQUIRE(st.st_uid == ::geteuid());
}

TEST_CASE("a client of another uid is refused by the program, and the refusal is logged", "[emu][security]") {
  if (::geteuid() != 0) VMMCKPT_SKIP("needs root to become another uid inside the test");
  scratch_dir dir;
  const fs::path log = dir.path / "shim.log";
  // A runtime directory of this test's own: any other program under the shim that starts meanwhile
  // (tests run in parallel) sets the shared one back to 0700, closing the door opened below.
  const fs::path xdg = dir.path / "xdg";
  fs::create_directory(xdg);
  background_process program(
      {cuda_ckpt, "run", "--", writer_program, "--seconds", "60"},
      {{"VMMCKPT_LOG_FILE", log.string()}, {"VMMCKPT_LOG_LEVEL", "info"}, {"XDG_RUNTIME_DIR", xdg.string()}});
  REQUIRE(program.wait_for_output("ready\n"));
  const std::string dir_path = (xdg / "vmmckpt").string();
  const std::string path = dir_path + "/" + std::to_string(program.pid()) + ".sock";
  // Open the door on purpose (it is 0700/0600): the program's own peer check must still say no.
  ::chmod(dir.path.c_str(), 0711);
  ::chmod(xdg.c_str(), 0711);
  ::chmod(dir_path.c_str(), 0711);
  ::chmod(path.c_str(), 0666);
  const pid_t child = ::fork();
  if (child == 0) {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) _exit(3);
    // Through the socket file and through the abstract name, which anyone may connect to: the
    // connection is made, then refused, closing without an answer.
    for (const std::string& address : {path, vmmckpt::protocol::abstract_address(program.pid())}) {
      vmmckpt::protocol::failure error;
      const int fd = vmmckpt::protocol::connect_to(address, error);
      if (fd < 0) _exit(4);
      vmmckpt::protocol::send_frame(fd, R"({"op":"hello"})", {}, error);
      std::string payload;
      std::vector<int> fds;
      if (vmmckpt::protocol::recv_frame(fd, payload, fds, 5000, error)) _exit(5);
      ::close(fd);
    }
    _exit(0);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  ::chmod(path.c_str(), 0600);
  ::chmod(dir_path.c_str(), 0700);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  // The first refusal is logged at once, the second (within the same second) on its own line a second later.
  auto logged = [&] {
    std::ifstream in(log);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  };
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (logged().find("refused a connection from uid 65534") ==
             logged().rfind("refused a connection from uid 65534") &&
         std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const std::string text = logged();
  INFO(text);
  REQUIRE(text.find("refused a connection from uid 65534") != std::string::npos);
  REQUIRE(text.find("refused a connection from uid 65534") != text.rfind("refused a connection from uid 65534"));
  // The owner still gets in.
  REQUIRE(run_process({cuda_ckpt, "check", std::to_string(program.pid())}).exit_code == 0);
}

TEST_CASE("another uid reconnecting in a loop: refusals are logged at most once a second, with their count",
          "[emu][security]") {
  if (::geteuid() != 0) VMMCKPT_SKIP("needs root to become another uid inside the test");
  scratch_dir dir;
  const fs::path log = dir.path / "shim.log";
  background_process program({cuda_ckpt, "run", "--", writer_program, "--seconds", "60"},
                             {{"VMMCKPT_LOG_FILE", log.string()}, {"VMMCKPT_LOG_LEVEL", "info"}});
  REQUIRE(program.wait_for_output("ready\n"));
  constexpr int attempts = 400;
  const auto start = std::chrono::steady_clock::now();
  const pid_t child = ::fork();
  if (child == 0) {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) _exit(3);
    // The abstract name, which anyone may connect to: each connection is made, then refused.
    for (int i = 0; i < attempts; ++i) {
      vmmckpt::protocol::failure error;
      const int fd = vmmckpt::protocol::connect_to(vmmckpt::protocol::abstract_address(program.pid()), error);
      if (fd < 0) _exit(4);
      std::string payload;
      std::vector<int> fds;
      vmmckpt::protocol::recv_frame(fd, payload, fds, 5000, error);  // the refusal: the connection closes
      ::close(fd);
    }
    _exit(0);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // the last second's count is due by now
  std::ifstream in(log);
  int lines = 0, counted = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.find("refused a connection from uid 65534") != std::string::npos) {
      ++lines;
      ++counted;
    } else if (const auto at = line.find("refused ");
               at != std::string::npos && line.find(" connections within a second") != std::string::npos) {
      ++lines;
      counted += std::stoi(line.substr(at + 8));
    }
  }
  INFO(lines << " lines for " << attempts << " refusals in " << seconds << " s");
  CHECK(counted == attempts);                     // every refusal is counted
  CHECK(lines <= static_cast<int>(seconds) + 3);  // at most one line a second (and the first at once)
  REQUIRE(run_process({cuda_ckpt, "check", std::to_string(program.pid())}).exit_code == 0);
}

namespace {

// /tmp/vmmckpt-UID and UID's private socket directories (/tmp/vmmckpt-UID.*) removed before and after: a uid
// of a test's own, no program of which runs elsewhere.
struct socket_dirs_of {
  uid_t uid;
  fs::path dir;
  explicit socket_dirs_of(uid_t u) : uid(u), dir("/tmp/vmmckpt-" + std::to_string(u)) { clear(); }
  ~socket_dirs_of() { clear(); }
  void clear() const {
    std::error_code ec;
    fs::remove_all(dir, ec);
    const std::string prefix = dir.filename().string() + ".";
    for (const auto& e : fs::directory_iterator("/tmp", ec))
      if (e.path().filename().string().rfind(prefix, 0) == 0) fs::remove_all(e.path(), ec);
  }
};

// `cuda-ckpt run -- emu_busy_writer` as uid, without XDG_RUNTIME_DIR, held back until release(): its pid is
// known before its first CUDA call (sh, setpriv, cuda-ckpt run and the writer are one process, exec after exec).
class held_program {
 public:
  held_program(const scratch_dir& dir, uid_t uid)
      : fifo_(dir.path / "go"),
        made_(::mkfifo(fifo_.c_str(), 0666) == 0 && ::chmod(fifo_.c_str(), 0666) == 0 &&
              ::chmod(dir.path.c_str(), 0755) == 0),
        program_({"setpriv", "--reuid=" + std::to_string(uid), "--regid=" + std::to_string(uid), "--clear-groups", "sh",
                  "-c", R"(read -r line < "$0"; exec "$1" run -- "$2" --seconds 120)", fifo_.string(), cuda_ckpt,
                  writer_program},
                 {{"XDG_RUNTIME_DIR", ""}}) {
    REQUIRE(made_);
  }
  pid_t pid() const { return program_.pid(); }
  background_process& process() { return program_; }
  // Lets it go on: it execs the writer, which makes its first CUDA call (and starts its control server).
  void release() {
    int fd = -1;
    for (int i = 0; i < 3000 && fd < 0; ++i) {  // until sh has opened the fifo (ENXIO before): 30 s at most
      fd = ::open(fifo_.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
      if (fd < 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    REQUIRE(fd >= 0);
    REQUIRE(::write(fd, "go\n", 3) == 3);
    ::close(fd);
  }

 private:
  fs::path fifo_;
  bool made_;
  background_process program_;
};

// Another user (uid 65534) who took a program's addresses first: it binds and listens at each of `addresses`
// (abstract names, or socket files in `planted`, a directory it makes as /tmp/vmmckpt-UID would be, open
// to all), takes every connection and counts the bytes it is sent, until stop().
class squatter {
 public:
  struct counts {
    long connections = -1;
    long bytes = -1;
  };

  squatter(const std::vector<std::string>& addresses, const fs::path& planted) {
    int ready[2], stop[2];
    REQUIRE(::pipe2(ready, O_CLOEXEC) == 0);
    REQUIRE(::pipe2(stop, O_CLOEXEC) == 0);
    child_ = ::fork();
    REQUIRE(child_ >= 0);
    if (child_ == 0) {
      ::close(ready[0]);
      ::close(stop[1]);
      serve(addresses, planted, ready[1], stop[0]);
    }
    ::close(ready[1]);
    ::close(stop[0]);
    results_ = ready[0];
    stop_ = stop[1];
    pollfd p{results_, POLLIN, 0};
    char c = 0;
    REQUIRE(::poll(&p, 1, 30'000) == 1);
    REQUIRE(::read(results_, &c, 1) == 1);
    REQUIRE(c == 'r');
  }
  ~squatter() {
    if (child_ > 0) {
      ::kill(child_, SIGKILL);
      ::waitpid(child_, nullptr, 0);
    }
    ::close(results_);
    ::close(stop_);
  }
  counts stop() {
    counts got;
    ::close(stop_);
    stop_ = -1;
    if (::read(results_, &got, sizeof got) != static_cast<ssize_t>(sizeof got)) got = {};
    ::waitpid(child_, nullptr, 0);
    child_ = -1;
    return got;
  }

 private:
  [[noreturn]] static void serve(const std::vector<std::string>& addresses, const fs::path& planted, int ready,
                                 int stop) {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) _exit(3);
    if (::mkdir(planted.c_str(), 0755) != 0 || ::chmod(planted.c_str(), 0755) != 0) _exit(4);
    pollfd p[64];
    nfds_t n = 0;
    p[n++] = {stop, POLLIN, 0};
    for (const std::string& address : addresses) {
      vmmckpt::protocol::failure error;
      const int fd = vmmckpt::protocol::listen_at(address, error);
      if (fd < 0 || (!vmmckpt::protocol::is_abstract(address) && ::chmod(address.c_str(), 0666) != 0)) _exit(5);
      p[n++] = {fd, POLLIN, 0};
    }
    const nfds_t listeners = n;
    if (::write(ready, "r", 1) != 1) _exit(6);
    counts got{0, 0};
    for (;;) {
      if (::poll(p, n, -1) < 0) continue;
      if (p[0].revents != 0) break;  // stop: its write end closed
      for (nfds_t i = 1; i < n; ++i) {
        if (p[i].revents == 0) continue;
        if (i < listeners) {
          const int fd = ::accept4(p[i].fd, nullptr, nullptr, SOCK_CLOEXEC);
          if (fd >= 0 && n < 64) {
            ++got.connections;
            p[n++] = {fd, POLLIN, 0};
          }
          continue;
        }
        char buffer[256];
        const ssize_t r = ::read(p[i].fd, buffer, sizeof buffer);
        if (r > 0) {
          got.bytes += r;
        } else {  // closed: never read again
          ::close(p[i].fd);
          p[i].fd = -1;
        }
      }
    }
    _exit(::write(ready, &got, sizeof got) == static_cast<ssize_t>(sizeof got) ? 0 : 7);
  }

  pid_t child_ = -1;
  int results_ = -1;
  int stop_ = -1;
};

// ps's status of pid, run as root: "" when not listed.
std::string ps_status(pid_t pid) {
  const auto ps = run_process({cuda_ckpt, "ps", std::to_string(pid), "--json"});
  INFO(describe(ps));
  REQUIRE(ps.exit_code == 0);
  for (const auto& p : nlohmann::json::parse(ps.out))
    if (p.at("pid").get<pid_t>() == pid) return p.at("status").get<std::string>();
  return {};
}

// The program's owner dumps it (without XDG_RUNTIME_DIR, as the program runs) into a directory of its own.
process_result dump_as(uid_t uid, pid_t pid, const scratch_dir& dir) {
  const fs::path out = dir.path / "owned";
  fs::create_directory(out);
  REQUIRE(::chown(out.c_str(), uid, uid) == 0);
  return run_process({"setpriv", "--reuid=" + std::to_string(uid), "--regid=" + std::to_string(uid), "--clear-groups",
                      cuda_ckpt, "dump", std::to_string(pid), "-o", (out / "image").string()},
                     {{"XDG_RUNTIME_DIR", ""}});
}

}  // namespace

TEST_CASE("another user who takes a program's abstract name and socket directory first keeps nobody from it",
          "[emu][security]") {
  if (::geteuid() != 0) VMMCKPT_SKIP("needs root to act as two other users inside the test");
  constexpr uid_t owner = 65533;
  const socket_dirs_of dirs(owner);
  scratch_dir dir;
  held_program program(dir, owner);
  // Between the program's start and its first CUDA call: its name, and the directory its socket file goes to.
  squatter other({vmmckpt::protocol::abstract_address(program.pid())}, dirs.dir);
  program.release();
  REQUIRE(program.process().wait_for_output("ready\n"));
  CHECK(ps_status(program.pid()) == "running");
  const auto dumped = dump_as(owner, program.pid(), dir);
  INFO(describe(dumped));
  REQUIRE(dumped.exit_code == 0);
  const auto checked = run_process({cuda_ckpt, "check", std::to_string(program.pid())});  // root too
  INFO(describe(checked));
  REQUIRE(checked.exit_code == 0);
  REQUIRE(program.process().running());
}

TEST_CASE("a server posing as a program at its socket file and its abstract name is sent nothing", "[emu][security]") {
  if (::geteuid() != 0) VMMCKPT_SKIP("needs root to act as two other users inside the test");
  constexpr uid_t owner = 65531;
  const socket_dirs_of dirs(owner);
  scratch_dir dir;
  held_program program(dir, owner);
  const std::string pid = std::to_string(program.pid());
  // Both where a tool looks first: the socket file in /tmp/vmmckpt-UID (its directory taken first), and the name.
  squatter poser({(dirs.dir / (pid + ".sock")).string(), vmmckpt::protocol::abstract_address(program.pid())}, dirs.dir);
  program.release();
  REQUIRE(program.process().wait_for_output("ready\n"));
  const auto dumped = dump_as(owner, program.pid(), dir);
  INFO(describe(dumped));
  REQUIRE(dumped.exit_code == 0);
  CHECK(ps_status(program.pid()) == "running");
  const auto got = poser.stop();
  INFO(got.connections << " connections to the poser");
  REQUIRE(got.connections >= 1);  // it was asked (its socket file comes first), and left before saying anything
  REQUIRE(got.bytes == 0);
  REQUIRE(program.process().running());
}

TEST_CASE("gc removes the private socket directory of a killed program, with its socket",
          "[emu][security][leftovers]") {
  if (::geteuid() != 0) VMMCKPT_SKIP("needs root to act as two other users inside the test");
  constexpr uid_t owner = 65530;
  const socket_dirs_of dirs(owner);
  scratch_dir dir;
  held_program program(dir, owner);
  squatter other({}, dirs.dir);  // /tmp/vmmckpt-65530 taken: the program listens in a private directory
  program.release();
  REQUIRE(program.process().wait_for_output("ready\n"));
  const auto private_dirs = [&] {
    std::vector<fs::path> found;
    for (const auto& e : fs::directory_iterator("/tmp"))
      if (e.path().filename().string().rfind(dirs.dir.filename().string() + ".", 0) == 0) found.push_back(e.path());
    return found;
  };
  const auto made = private_dirs();
  REQUIRE(made.size() == 1);
  REQUIRE(fs::is_socket(made[0] / (std::to_string(program.pid()) + ".sock")));
  ::kill(program.pid(), SIGKILL);
  program.process().wait();
  const auto gc = run_process({"setpriv", "--reuid=" + std::to_string(owner), "--regid=" + std::to_string(owner),
                               "--clear-groups", cuda_ckpt, "gc"},
                              {{"XDG_RUNTIME_DIR", ""}});
  INFO(describe(gc));
  REQUIRE(gc.exit_code == 0);
  CHECK(gc.out.find("the socket of a process that is gone") != std::string::npos);
  REQUIRE(private_dirs().empty());
}

TEST_CASE("another user's dump --job and dump --process of root's program say it belongs to another user",
          "[emu][security]") {
  if (::geteuid() != 0) VMMCKPT_SKIP("needs root to run the tool as another user");
  auto program = start_writer();
  const std::string pid = std::to_string(program->pid());
  scratch_dir dir;
  ::chmod(dir.path.c_str(), 0777);  // nobody may write there: the refusal must not depend on it
  std::map<std::string, std::string> env;
  if (const std::string criu = criu_for_tests(); !criu.empty()) env["VMMCKPT_CRIU"] = criu;
  std::vector<std::vector<std::string>> commands{{"dump", "--job", pid}, {"suspend", "--job", pid}};
  if (env.count("VMMCKPT_CRIU") != 0) {
    commands.push_back({"dump", "--process", pid});
    commands.push_back({"dump", "--job", pid, "--process"});
  }
  for (auto args : commands) {
    args.insert(args.begin(), {"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", cuda_ckpt});
    args.insert(args.end(), {"-o", (dir.path / "image").string()});
    const auto r = run_process(args, env, 120);
    INFO(describe(r));
    if (r.exit_code >= 126 || r.err.find("setpriv:") != std::string::npos)
      VMMCKPT_SKIP("cannot run cuda-ckpt as another user here: " + r.err);
    CHECK(r.exit_code == 1);
    CHECK(r.err.find("process " + pid + " belongs to another user (uid 0)") != std::string::npos);
    CHECK_FALSE(fs::exists(dir.path / "image"));
  }
  REQUIRE(program->running());
}

TEST_CASE("another user's gc over a tree holding root's image skips it, names it, and collects the rest",
          "[emu][security][leftovers]") {
  if (::geteuid() != 0) VMMCKPT_SKIP("needs root to run the tool as another user");
  scratch_dir dir;
  ::chmod(dir.path.c_str(), 0755);
  const fs::path tree = dir.path / "tree";
  fs::create_directory(tree);
  // Root's image, closed to others, and unfinished images of nobody's whose writers are gone (no such pid).
  const fs::path roots = tree / "root-image";
  fs::create_directory(roots);
  std::ofstream(roots / "suspend.accepted") << "root's\n";
  ::chmod(roots.c_str(), 0700);
  std::vector<fs::path> theirs;
  for (const char* name : {"a.partial-999999991-x", "b.partial-999999992-x", "c.partial-999999993-x"}) {
    theirs.push_back(tree / name);
    fs::create_directory(theirs.back());
    REQUIRE(::chown(theirs.back().c_str(), 65534, 65534) == 0);
  }
  REQUIRE(::chown(tree.c_str(), 65534, 65534) == 0);
  auto as_nobody = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", cuda_ckpt});
    return run_process(args);
  };
  const auto dry = as_nobody({"gc", tree.string(), "--dry-run", "--json"});
  INFO(describe(dry));
  if (dry.exit_code >= 126 || dry.err.find("setpriv:") != std::string::npos)
    VMMCKPT_SKIP("cannot run cuda-ckpt as another user here: " + dry.err);
  REQUIRE(dry.exit_code == 0);
  const auto listed = nlohmann::json::parse(dry.out);
  REQUIRE(listed["skipped"].size() == 1);
  CHECK(listed["skipped"][0]["path"] == roots.string());
  CHECK(listed["skipped"][0]["why"].get<std::string>().find("Permission denied") != std::string::npos);
  std::size_t in_tree = 0;  // nobody's stale sockets elsewhere may be listed too
  for (const auto& r : listed["removed"]) in_tree += r["path"].get<std::string>().rfind(tree.string(), 0) == 0;
  CHECK(in_tree == theirs.size());

  const auto gc = as_nobody({"gc", tree.string()});
  INFO(describe(gc));
  CHECK(gc.exit_code == 0);
  CHECK(gc.out.find("skipped " + roots.string() + ": cannot read it: Permission denied") != std::string::npos);
  CHECK(gc.err.find("1 entry skipped") != std::string::npos);
  for (const auto& p : theirs) CHECK_FALSE(fs::exists(p));
  CHECK(fs::exists(roots / "suspend.accepted"));
}
