// cuda-ckpt ps: processes found whatever their environment or owner, busy ones shown with their state,
// orphaned images shown with the command that removes them, and nothing but stale sockets removed.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "e2e_support.hpp"
#include "vmmckpt/protocol/protocol.hpp"

using namespace vmmckpt::test;

namespace {

using steady = std::chrono::steady_clock;

// ps's entry for pid (nullopt when not listed), and how long ps took.
std::optional<nlohmann::json> ps_entry(pid_t pid, double* seconds = nullptr) {
  const auto start = steady::now();
  const auto ps = run_process({cuda_ckpt, "ps", "--json"});
  if (seconds != nullptr) *seconds = std::chrono::duration<double>(steady::now() - start).count();
  INFO(describe(ps));
  REQUIRE(ps.exit_code == 0);
  for (const auto& p : nlohmann::json::parse(ps.out))
    if (p.at("pid").get<pid_t>() == pid && p.at("status") != "orphaned") return p;
  return std::nullopt;
}

// A socket file at path that nobody listens at: what a killed process leaves.
void make_stale_socket(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  REQUIRE(path.size() < sizeof addr.sun_path);
  std::memcpy(addr.sun_path, path.c_str(), path.size());
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  ::close(fd);
}

// The pid of a process that has just ended.
pid_t dead_pid() {
  const pid_t child = ::fork();
  if (child == 0) _exit(0);
  ::waitpid(child, nullptr, 0);
  return child;
}

}  // namespace

TEST_CASE("ps: a process with another XDG_RUNTIME_DIR is found, listed alone by ps PID, and dumped", "[emu][ps]") {
  scratch_dir dir;
  const fs::path xdg = dir.path / "xdg";  // as sudo, ssh, systemd or a Slurm job would set it
  fs::create_directory(xdg);
  fs::permissions(xdg, fs::perms::owner_all, fs::perm_options::replace);
  background_process program({cuda_ckpt, "run", "--", writer_program, "--seconds", "120"},
                             {{"XDG_RUNTIME_DIR", xdg.string()}});
  REQUIRE(program.wait_for_output("ready\n"));
  const std::string pid = std::to_string(program.pid());
  // Its socket file is where its own environment says, not in ours.
  REQUIRE(fs::exists(fs::symlink_status(xdg / "vmmckpt" / (pid + ".sock"))));
  REQUIRE_FALSE(fs::exists(fs::symlink_status(vmmckpt::protocol::socket_path(program.pid()))));

  const auto entry = ps_entry(program.pid());
  REQUIRE(entry.has_value());
  REQUIRE(entry->at("status") == "running");
  REQUIRE(entry->at("state") == "running");
  REQUIRE(entry->at("uid").get<uid_t>() == ::geteuid());

  const auto alone = run_process({cuda_ckpt, "ps", pid, "--json"});
  INFO(describe(alone));
  REQUIRE(alone.exit_code == 0);
  const auto list = nlohmann::json::parse(alone.out);
  REQUIRE(list.size() == 1);
  REQUIRE(list.at(0).at("pid").get<pid_t>() == program.pid());
  const auto human = run_process({cuda_ckpt, "ps", pid});
  REQUIRE(human.exit_code == 0);
  REQUIRE(human.out.find("running") != std::string::npos);

  // Without its socket file the abstract name still finds it.
  fs::remove(xdg / "vmmckpt" / (pid + ".sock"));
  const fs::path out = dir.path / "image";
  const auto dumped = run_process({cuda_ckpt, "dump", pid, "-o", out.string()});
  INFO(describe(dumped));
  REQUIRE(dumped.exit_code == 0);
  require_untorn(out);
  REQUIRE(program.running());
}

TEST_CASE("ps PID and dump of a process not under vmmckpt say so, and name a socket left by an earlier pid",
          "[emu][ps]") {
  background_process plain({"sleep", "60"});
  const std::string pid = std::to_string(plain.pid());
  vmmckpt::protocol::failure error;
  REQUIRE(vmmckpt::protocol::ensure_runtime_dir(error));
  // As if an earlier process of this pid ran under vmmckpt and was killed.
  const std::string stale = vmmckpt::protocol::socket_path(plain.pid());
  make_stale_socket(stale);
  const auto r = run_process({cuda_ckpt, "dump", pid, "-o", "/nonexistent/image"});
  INFO(describe(r));
  REQUIRE(r.exit_code == 1);
  REQUIRE(r.err.find("is not running under vmmckpt: libvmmckpt.so is not loaded in it") != std::string::npos);
  REQUIRE(r.err.find("(sleep)") != std::string::npos);
  // Another test's ps may have removed the stale socket meanwhile; while it is there, it is named.
  if (fs::exists(fs::symlink_status(stale))) REQUIRE(r.err.find("left by an earlier process") != std::string::npos);

  const auto ps = run_process({cuda_ckpt, "ps", pid});
  REQUIRE(ps.exit_code == 1);
  REQUIRE(ps.err.find("not running under vmmckpt") != std::string::npos);
  fs::remove(stale);
}

TEST_CASE("ps removes stale sockets only: never a regular file named N.sock, never a live process's", "[emu][ps]") {
  auto program = start_writer();
  vmmckpt::protocol::failure error;
  REQUIRE(vmmckpt::protocol::ensure_runtime_dir(error));
  const std::string dir = vmmckpt::protocol::runtime_dir();
  const pid_t gone = dead_pid();
  const std::string regular = dir + "/" + std::to_string(gone) + ".sock";
  { std::ofstream(regular) << "not a socket"; }
  const pid_t gone_too = dead_pid();
  const std::string stale = dir + "/" + std::to_string(gone_too) + ".sock";
  make_stale_socket(stale);

  REQUIRE(ps_entry(program->pid()).has_value());
  REQUIRE(fs::is_regular_file(regular));
  REQUIRE_FALSE(fs::exists(fs::symlink_status(stale)));
  REQUIRE(fs::exists(fs::symlink_status(vmmckpt::protocol::socket_path(program->pid()))));
  fs::remove(regular);
}

TEST_CASE("ps shows busy processes with their state: dumping, suspending, resuming, not responding", "[emu][ps]") {
  scratch_dir dir;
  auto program = start_writer();
  const std::string pid = std::to_string(program->pid());
  double slowest = 0;
  // Polls ps until pid shows `status` (or the tool in the background is done); the entry seen.
  auto wait_for_status = [&](const std::string& status, background_process& tool,
                             pid_t of = 0) -> std::optional<nlohmann::json> {
    for (int i = 0; i < 200 && tool.running(); ++i) {
      double seconds = 0;
      auto entry = ps_entry(of != 0 ? of : program->pid(), &seconds);
      slowest = std::max(slowest, seconds);
      REQUIRE(entry.has_value());  // listed all along, busy or not
      if (entry->at("status") == status) return entry;
      usleep(50'000);
    }
    return std::nullopt;
  };

  SECTION("dumping") {
    // The tool pauses while it holds the program, as a long copy would.
    background_process dump({cuda_ckpt, "dump", pid, "-o", (dir.path / "image").string()},
                            {{"VMMCKPT_TEST_FAULT", "held=pause:8000"}});
    const auto seen = wait_for_status("dumping", dump);
    REQUIRE(seen.has_value());
    REQUIRE(seen->at("state") == "running");
    REQUIRE(seen->at("activity") == "dumping");
    const auto human = run_process({cuda_ckpt, "ps", pid});
    REQUIRE(human.out.find("dumping") != std::string::npos);
    REQUIRE(dump.wait() == 0);
  }
  SECTION("suspending, then suspended") {
    background_process suspend({cuda_ckpt, "suspend", pid, "-o", (dir.path / "suspended").string()},
                               {{"VMMCKPT_TEST_FAULT", "held=pause:8000"}});
    REQUIRE(wait_for_status("suspending", suspend).has_value());
    REQUIRE(suspend.wait() == 0);
    const auto after = ps_entry(program->pid());
    REQUIRE(after.has_value());
    REQUIRE(after->at("status") == "suspended");
    REQUIRE(run_process({cuda_ckpt, "resume", pid}).exit_code == 0);
  }
  SECTION("resuming") {
    // The program pauses in its resume, as a resume of many gigabytes takes its time.
    background_process slow({cuda_ckpt, "run", "--", writer_program, "--seconds", "120"},
                            {{"VMMCKPT_TEST_FAULT", "program:resuming=pause:8000"}});
    REQUIRE(slow.wait_for_output("ready\n"));
    const std::string slow_pid = std::to_string(slow.pid());
    REQUIRE(run_process({cuda_ckpt, "suspend", slow_pid, "-o", (dir.path / "slow").string()}).exit_code == 0);
    background_process resume({cuda_ckpt, "resume", slow_pid});
    const auto seen = wait_for_status("resuming", resume, slow.pid());
    REQUIRE(seen.has_value());
    REQUIRE(seen->at("state") == "suspended");  // until the memory is back
    REQUIRE(resume.wait() == 0);
    REQUIRE(ps_entry(slow.pid())->at("status") == "running");
  }
  SECTION("not responding: stopped") {
    REQUIRE(::kill(program->pid(), SIGSTOP) == 0);
    double seconds = 0;
    const auto entry = ps_entry(program->pid(), &seconds);
    slowest = std::max(slowest, seconds);
    ::kill(program->pid(), SIGCONT);
    REQUIRE(entry.has_value());
    REQUIRE(entry->at("status") == "not responding");
    REQUIRE(entry->at("problem").get<std::string>().find("it is stopped") != std::string::npos);
  }
  // ps asks every process at once and gives each one second (docs: ps --help); the bound here is
  // loose on purpose, for a loaded machine: what it catches is a ps that waits per process or forever.
  INFO("slowest ps: " << slowest << " s");
  REQUIRE(slowest < 15);
  REQUIRE(program->running());
}

TEST_CASE("ps shows the suspend image of a killed process as orphaned, with its size and gc, which removes it",
          "[emu][ps][leftovers]") {
  auto program = start_writer();
  const auto s = run_process({cuda_ckpt, "suspend", std::to_string(program->pid()), "--json"});
  INFO(describe(s));
  REQUIRE(s.exit_code == 0);
  const fs::path image = nlohmann::json::parse(s.out).at("image").get<std::string>();
  REQUIRE(fs::is_directory(image));
  const pid_t pid = program->pid();
  ::kill(pid, SIGKILL);
  program->wait();

  const auto ps = run_process({cuda_ckpt, "ps", "--json"});
  INFO(describe(ps));
  std::optional<nlohmann::json> orphan;
  for (const auto& p : nlohmann::json::parse(ps.out))
    if (p.at("status") == "orphaned" && p.at("image") == image.string()) orphan = p;
  REQUIRE(orphan.has_value());
  REQUIRE(orphan->at("pid").get<pid_t>() == pid);
  REQUIRE(orphan->at("image_bytes").get<std::uint64_t>() >= writer_buffers * writer_buffer_size);
  REQUIRE(orphan->at("remove_with") == "cuda-ckpt gc");
  const auto human = run_process({cuda_ckpt, "ps", std::to_string(pid)});
  INFO(describe(human));
  REQUIRE(human.exit_code == 0);
  REQUIRE(human.out.find("orphaned") != std::string::npos);
  REQUIRE(human.out.find(image.string() + " (") != std::string::npos);
  REQUIRE(human.out.find("MiB)") != std::string::npos);
  REQUIRE(human.out.find("`cuda-ckpt gc` removes it") != std::string::npos);

  const auto gc = run_process({cuda_ckpt, "gc", "--json"});
  INFO(describe(gc));
  REQUIRE(gc.exit_code == 0);
  bool removed = false;
  const auto report = nlohmann::json::parse(gc.out);
  for (const auto& r : report.at("removed")) removed |= r.at("path") == image.string();
  REQUIRE(removed);
  REQUIRE_FALSE(fs::exists(image));
}

TEST_CASE("an empty ps says where it looked", "[emu][ps]") {
  // Another uid has no process under vmmckpt here (and cannot read ours): ps finds nothing.
  if (::geteuid() != 0) VMMCKPT_SKIP("needs root to run ps as a user with no process (others' may run here)");
  const auto r = run_process({"setpriv", "--reuid=65532", "--regid=65532", "--clear-groups", cuda_ckpt, "ps"},
                             {{"XDG_RUNTIME_DIR", ""}});
  INFO(describe(r));
  REQUIRE(r.exit_code == 0);
  REQUIRE(r.out.find("no process under vmmckpt (looked at /proc/*/maps for libvmmckpt.so") != std::string::npos);
  REQUIRE(r.out.find("/tmp/vmmckpt-65532") != std::string::npos);
  REQUIRE(r.out.find("no orphaned image in /dev/shm/vmmckpt-65532") != std::string::npos);
}

TEST_CASE("root's ps lists another user's process, and root may act on it", "[emu][ps][security]") {
  if (::geteuid() != 0) VMMCKPT_SKIP("needs root to start a program as another uid");
  background_process program({"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", cuda_ckpt, "run", "--",
                              writer_program, "--seconds", "120"},
                             {{"XDG_RUNTIME_DIR", ""}});
  REQUIRE(program.wait_for_output("ready\n"));
  const auto entry = ps_entry(program.pid());
  REQUIRE(entry.has_value());
  REQUIRE(entry->at("uid").get<uid_t>() == 65534);
  REQUIRE(entry->at("status") == "running");
  const auto check = run_process({cuda_ckpt, "check", std::to_string(program.pid())});
  INFO(describe(check));
  REQUIRE(check.exit_code == 0);
}

TEST_CASE("a process with the shim loaded but no control server is never called 'not under vmmckpt'", "[emu][ps]") {
  // sleep makes no CUDA call: the shim is loaded, its server never starts.
  background_process idle({cuda_ckpt, "run", "--", "sleep", "60"});
  const std::string pid = std::to_string(idle.pid());
  std::string maps;
  for (int i = 0; i < 100 && maps.find("libvmmckpt.so") == std::string::npos; ++i) {
    usleep(50'000);  // until the exec has happened
    std::ifstream in("/proc/" + pid + "/maps");
    maps.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  REQUIRE(maps.find("libvmmckpt.so") != std::string::npos);

  const auto dumped = run_process({cuda_ckpt, "dump", pid, "-o", "/nonexistent/image"});
  INFO(describe(dumped));
  REQUIRE(dumped.exit_code == 1);
  REQUIRE(dumped.err.find("not running under vmmckpt") == std::string::npos);
  REQUIRE(dumped.err.find("runs under vmmckpt (libvmmckpt.so is loaded) but has no control server") !=
          std::string::npos);
  const auto alone = run_process({cuda_ckpt, "ps", pid, "--json"});
  INFO(describe(alone));
  REQUIRE(alone.exit_code == 0);
  REQUIRE(nlohmann::json::parse(alone.out).at(0).at("status") == "no control server");
  // The full list counts it on its last line instead of a row of dashes.
  const auto all = run_process({cuda_ckpt, "ps"});
  REQUIRE(all.out.find("loaded but no control server") != std::string::npos);
}

namespace {

// The pid of `parent`'s first child, once it has one (unshare --fork's child); 0 on timeout.
pid_t first_child(pid_t parent) {
  for (int i = 0; i < 500; ++i) {
    std::ifstream in("/proc/" + std::to_string(parent) + "/task/" + std::to_string(parent) + "/children");
    pid_t child = 0;
    if (in >> child && child > 0) return child;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return 0;
}

}  // namespace

TEST_CASE("A program in namespaces of its own (pid, mount with its own /tmp, network) is found, dumped, suspended and "
          "resumed",
          "[emu][ps][namespace][leftovers]") {
  // As a container runs it: it names its socket by the pid it sees (1), in a /tmp only its mount namespace has,
  // and its abstract name lives in a network namespace of its own. The tool reaches it through /proc/PID/root.
  if (run_process({"unshare", "--pid", "--fork", "--mount", "--net", "true"}).exit_code != 0 &&
      run_process({"unshare", "--user", "--map-root-user", "--pid", "--fork", "--mount", "--net", "true"}).exit_code !=
          0)
    VMMCKPT_SKIP("this machine lets no process make pid, mount and network namespaces (unshare failed)");
  const bool as_root = run_process({"unshare", "--pid", "--fork", "--mount", "--net", "true"}).exit_code == 0;
  std::vector<std::string> argv{"unshare"};
  if (!as_root) argv.insert(argv.end(), {"--user", "--map-root-user"});
  // The new /tmp hides the old one: a build under /tmp (a checkout there) is bound back at its path, through
  // the old /tmp kept at a directory outside it.
  const fs::path old_tmp = "/dev/shm/vmmckpt-ns-test-" + std::to_string(::getpid());
  fs::create_directories(old_tmp);
  const std::unique_ptr<void, std::function<void(void*)>> remove_old_tmp(reinterpret_cast<void*>(1), [old_tmp](void*) {
    std::error_code ec;
    fs::remove(old_tmp, ec);
  });
  argv.insert(argv.end(), {"--pid", "--fork", "--mount", "--net", "sh", "-c",
                           "mount --bind /tmp \"$3\" && mount -t tmpfs none /tmp && "
                           "case \"$2\" in /tmp/*) mkdir -p \"$2\" && mount --bind \"$3${2#/tmp}\" \"$2\";; esac && "
                           "exec env -u XDG_RUNTIME_DIR \"$0\" run -- \"$1\" --seconds 120",
                           cuda_ckpt, writer_program, std::string(build_dir), old_tmp.string()});
  background_process outer(argv);
  REQUIRE(outer.wait_for_output("ready\n"));
  const pid_t program = first_child(outer.pid());
  REQUIRE(program > 0);
  // Killing unshare leaves its child running; the child is the namespace's init, and takes the rest with it.
  const std::unique_ptr<void, std::function<void(void*)>> end_namespace(reinterpret_cast<void*>(1),
                                                                        [program](void*) { ::kill(program, SIGKILL); });
  const std::string pid = std::to_string(program);

  const auto entry = ps_entry(program);
  REQUIRE(entry.has_value());
  REQUIRE(entry->at("status") == "running");

  scratch_dir dir;  // in our /tmp, which the program does not see
  const fs::path out = dir.path / "image";
  const auto dumped = run_process({cuda_ckpt, "dump", pid, "-o", out.string()});
  INFO(describe(dumped));
  REQUIRE(dumped.exit_code == 0);
  require_untorn(out);

  // Suspend writes an image the program reads back on resume: one in a directory it does not see is refused
  // before anything is held, and the program goes on; one both mount namespaces see works.
  const auto unseen = run_process({cuda_ckpt, "suspend", pid, "-o", (dir.path / "suspended").string()});
  INFO(describe(unseen));
  REQUIRE(unseen.exit_code == 1);
  REQUIRE(unseen.err.find("mount namespace of its own") != std::string::npos);
  REQUIRE_FALSE(fs::exists(dir.path / "suspended"));
  REQUIRE(listed_state(program).at("state") == "running");
  const fs::path shared = fs::path(build_dir) / ("namespace-suspend-" + pid);
  fs::remove_all(shared);
  const auto suspended = run_process({cuda_ckpt, "suspend", pid, "-o", shared.string()});
  INFO(describe(suspended));
  REQUIRE(suspended.exit_code == 0);
  REQUIRE(listed_state(program).at("state") == "suspended");
  const auto resumed = run_process({cuda_ckpt, "resume", pid});
  INFO(describe(resumed));
  REQUIRE(resumed.exit_code == 0);
  REQUIRE(::kill(program, 0) == 0);
  fs::remove_all(shared);
}

TEST_CASE("ps, ps PID and inspect show a command with escape sequences and newlines escaped, never raw",
          "[emu][ps][security]") {
  scratch_dir dir;
  // argv[0] as a hostile program sets it: clear the screen, then a forged row on a line of its own.
  const std::string hostile = "\x1b[2J\x1b[H\nFORGED   root     running";
  background_process p(
      {cuda_ckpt, "run", "--", "/bin/bash", "-c", "exec -a \"$1\" \"$0\" --seconds 60", writer_program, hostile});
  REQUIRE(p.wait_for_output("ready\n"));
  const std::string pid = std::to_string(p.pid());
  const fs::path image = dir.path / "image";
  REQUIRE(run_process({cuda_ckpt, "dump", pid, "-o", image.string()}).exit_code == 0);
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{cuda_ckpt, "ps"}, std::vector<std::string>{cuda_ckpt, "ps", pid},
        std::vector<std::string>{cuda_ckpt, "inspect", image.string()}}) {
    const auto r = run_process(args);
    INFO(args[1] << "\n" << describe(r));
    CHECK(r.exit_code == 0);
    CHECK(r.out.find('\x1b') == std::string::npos);
    CHECK(r.out.find("\nFORGED") == std::string::npos);
    CHECK(r.out.find("\\x1b[2J\\x1b[H\\x0aFORGED") != std::string::npos);
  }
  // --json keeps the command exact: JSON escapes it itself.
  const auto j = ps_entry(p.pid());
  REQUIRE(j.has_value());
  CHECK((*j)["command"][0] == hostile);
}
