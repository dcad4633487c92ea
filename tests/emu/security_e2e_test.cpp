// Security: the control socket's permissions, a client of another uid refused and logged, and another user's gc
// over root's image and job and whole-process commands on root's program.
#include <catch2/catch.hpp>

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
          "[emu][security]") {
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
