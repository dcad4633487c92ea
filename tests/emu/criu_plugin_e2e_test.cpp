// The CRIU plugin (criu/vmmckpt_criu.cpp) end to end on the emulated driver, with real CRIU run as a container
// runtime runs it: a plain `criu dump` / `criu restore` with the plugin in its library directory. emu_ticker's
// GPU buffers and CPU tick counter must go on together afterwards; a dump that fails leaves it running.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <thread>

#include "process_support.hpp"

namespace vmmckpt::test {
namespace {

const std::string plugin_dir = build_dir + "/lib/criu";

// CRIU 4: $VMMCKPT_CRIU, else the one scripts/provision-criu.sh put in .deps/; "" when there is none or this
// is not root, with the reason in `why`.
std::string criu_here(std::string& why) {
  if (::geteuid() != 0) {
    why = "CRIU dumps and restores processes as root only";
    return {};
  }
  std::string criu;
  if (const char* c = std::getenv("VMMCKPT_CRIU"); c != nullptr && *c != '\0') criu = c;
  const std::string provisioned = std::string(VMMCKPT_SOURCE_DIR) + "/.deps/criu/bin/criu";
  if (criu.empty() && ::access(provisioned.c_str(), X_OK) == 0) criu = provisioned;
  if (criu.empty()) why = "no CRIU 4: run scripts/provision-criu.sh, or set VMMCKPT_CRIU";
  // Restored processes are reparented here when CRIU goes: reaped by gone().
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  return criu;
}

bool eventually(const std::function<bool()>& done, int seconds = 30) {
  for (const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(seconds); !done();) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

bool gone(pid_t pid) {
  return eventually([&] {
    while (::waitpid(-1, nullptr, WNOHANG) > 0) {
    }
    return ::kill(pid, 0) != 0;
  });
}

bool has_bad_line(const fs::path& log) {
  for (const auto& line : lines_of(log))
    if (line.rfind("BAD", 0) == 0) return true;
  return false;
}

// emu_ticker under the shim in a session of its own, its output in files (CRIU takes them along).
struct ticker_job {
  scratch_dir dir;
  fs::path log = dir.path / "log";
  pid_t pid = 0;

  explicit ticker_job(const std::string& extra = "") {
    const auto r = run_process({"/bin/sh", "-c",
                                "setsid " + cuda_ckpt + " run -- " + ticker + " " + log.string() + " " + extra + " >" +
                                    (dir.path / "out").string() + " 2>&1 </dev/null & echo $!"});
    REQUIRE(r.exit_code == 0);
    pid = std::stoi(r.out);
    REQUIRE(eventually([&] { return last_tick(log) >= 3; }));
  }
  ~ticker_job() {
    ::kill(pid, SIGKILL);
    (void)!::system(("pkill -9 -f " + log.string() + " >/dev/null 2>&1").c_str());
    gone(pid);
  }
  bool goes_on(const fs::path& which, std::uint64_t ticks = 5) const {
    const std::uint64_t at = last_tick(which);
    return eventually([&] { return last_tick(which) >= at + ticks; });
  }
};

// `criu ARGS... --libdir <the plugin's directory>`, as a runtime would run it, with its log kept.
process_result criu(const std::string& binary, std::vector<std::string> args, const fs::path& log,
                    const std::map<std::string, std::string>& env = {}) {
  args.insert(args.begin(), binary);
  for (const std::string& a :
       {std::string("--libdir"), plugin_dir, std::string("-v4"), std::string("-o"), log.string()})
    args.push_back(a);
  // CRIU starts through its own loader, which ignores LD_LIBRARY_PATH: the plugin is told where the driver is.
  std::map<std::string, std::string> all{{"VMMCKPT_LIBCUDA", build_dir + "/lib/emu/libcuda.so.1"}};
  all.insert(env.begin(), env.end());
  return run_process(args, all, 120);
}

std::string log_text(const fs::path& log) {
  std::string text;
  for (const auto& line : lines_of(log))
    if (line.find("vmmckpt") != std::string::npos || line.find("Error") != std::string::npos) text += line + "\n";
  return text;
}

}  // namespace

TEST_CASE("criu plugin: a plain criu dump of a process tree under the shim, killed, comes back with criu restore",
          "[criu_plugin]") {
  std::string why;
  const std::string binary = criu_here(why);
  if (binary.empty()) VMMCKPT_SKIP(why);
  ticker_job job("--children 1");
  const fs::path child_log = job.log.string() + ".1";
  REQUIRE(eventually([&] { return last_tick(child_log) >= 3; }));
  const fs::path images = job.dir.path / "images";
  fs::create_directories(images);

  const auto dumped = criu(binary, {"dump", "-t", std::to_string(job.pid), "-D", images.string(), "--shell-job"},
                           job.dir.path / "dump.log");
  INFO(describe(dumped) << log_text(job.dir.path / "dump.log"));
  REQUIRE(dumped.exit_code == 0);
  REQUIRE(gone(job.pid));  // criu dump ends the tree
  // Each process's GPU part lies in CRIU's images directory, a suspend image that verifies.
  for (const pid_t p : {job.pid}) {
    const fs::path part = images / "vmmckpt" / std::to_string(p);
    REQUIRE(fs::is_directory(part));
    CHECK(run_process({cuda_ckpt, "verify", part.string()}).exit_code == 0);
  }
  CHECK(std::distance(fs::directory_iterator(images / "vmmckpt"), fs::directory_iterator{}) == 2);
  const std::uint64_t at_dump = last_tick(job.log);

  const auto restored =
      criu(binary, {"restore", "-D", images.string(), "--shell-job", "-d"}, job.dir.path / "restore.log");
  INFO(describe(restored) << log_text(job.dir.path / "restore.log"));
  REQUIRE(restored.exit_code == 0);
  // The ticks go on once the GPU memory is back, every buffer matching the counter (the ticker checks).
  REQUIRE(job.goes_on(job.log));
  REQUIRE(job.goes_on(child_log));
  CHECK(last_tick(job.log) > at_dump);
  CHECK_FALSE(has_bad_line(job.log));
  CHECK_FALSE(has_bad_line(child_log));
}

TEST_CASE("criu plugin: criu dump --leave-running, and a dump that fails midway: the program goes on with its memory",
          "[criu_plugin]") {
  std::string why;
  const std::string binary = criu_here(why);
  if (binary.empty()) VMMCKPT_SKIP(why);
  ticker_job job;
  const fs::path images = job.dir.path / "images";
  fs::create_directories(images);
  const auto kept =
      criu(binary, {"dump", "-t", std::to_string(job.pid), "-D", images.string(), "--shell-job", "--leave-running"},
           job.dir.path / "dump.log");
  INFO(describe(kept) << log_text(job.dir.path / "dump.log"));
  REQUIRE(kept.exit_code == 0);
  REQUIRE(job.goes_on(job.log));
  CHECK(listed_state(job.pid).at("state") == "running");  // its GPU memory back, not suspended
  CHECK_FALSE(has_bad_line(job.log));

  // The plugin fails after the GPU side was suspended and checkpointed: CRIU rolls back, and so does the plugin.
  const fs::path again = job.dir.path / "again";
  fs::create_directories(again);
  const auto failed = criu(binary, {"dump", "-t", std::to_string(job.pid), "-D", again.string(), "--shell-job"},
                           job.dir.path / "fail.log", {{"VMMCKPT_TEST_FAULT", "criu-plugin:checkpoint=fail"}});
  INFO(describe(failed) << log_text(job.dir.path / "fail.log"));
  CHECK(failed.exit_code != 0);
  REQUIRE(job.goes_on(job.log));
  CHECK(listed_state(job.pid).at("state") == "running");
  CHECK_FALSE(has_bad_line(job.log));
}

TEST_CASE("criu plugin: a process under the shim that does not answer is refused, never dumped without its GPU side",
          "[criu_plugin]") {
  std::string why;
  const std::string binary = criu_here(why);
  if (binary.empty()) VMMCKPT_SKIP(why);
  ticker_job job;
  const fs::path images = job.dir.path / "images";
  fs::create_directories(images);
  // Stopped, it cannot answer the plugin: CRIU alone would dump it (and end it), its GPU memory left out.
  REQUIRE(::kill(job.pid, SIGSTOP) == 0);
  const auto refused = criu(binary, {"dump", "-t", std::to_string(job.pid), "-D", images.string(), "--shell-job"},
                            job.dir.path / "dump.log");
  INFO(describe(refused) << log_text(job.dir.path / "dump.log"));
  CHECK(refused.exit_code != 0);
  CHECK(log_text(job.dir.path / "dump.log").find("did not answer") != std::string::npos);
  REQUIRE(::kill(job.pid, SIGCONT) == 0);
  REQUIRE(job.goes_on(job.log));
  CHECK(listed_state(job.pid).at("state") == "running");
  CHECK_FALSE(has_bad_line(job.log));
}


TEST_CASE("criu plugin: criu restore with a GPU part missing or a file in its place never leaves the process waiting",
          "[criu_plugin]") {
  std::string why;
  const std::string binary = criu_here(why);
  if (binary.empty()) VMMCKPT_SKIP(why);
  ticker_job job;
  const fs::path images = job.dir.path / "images";
  fs::create_directories(images);
  const auto dumped = criu(binary, {"dump", "-t", std::to_string(job.pid), "-D", images.string(), "--shell-job"},
                           job.dir.path / "dump.log");
  INFO(describe(dumped) << log_text(job.dir.path / "dump.log"));
  REQUIRE(dumped.exit_code == 0);
  REQUIRE(gone(job.pid));
  const fs::path part = images / "vmmckpt" / std::to_string(job.pid);
  const fs::path log = "/tmp/vmmckpt-criu-" + std::to_string(job.pid) + ".log";
  std::error_code ec;
  fs::remove(log, ec);
  fs::remove_all(part);
  std::string cause = "is missing";
  SECTION("a regular file in its place") {
    std::ofstream(part) << "not a GPU part\n";
    cause = "is not a directory (a regular file)";
  }
  SECTION("missing") {}

  const auto restored =
      criu(binary, {"restore", "-D", images.string(), "--shell-job", "-d"}, job.dir.path / "restore.log");
  INFO(describe(restored) << log_text(job.dir.path / "restore.log"));
  // CRIU fails, or the process is ended: never one left suspended for good, its CUDA calls waiting.
  REQUIRE(gone(job.pid));
  REQUIRE(eventually([&] { return !lines_of(log).empty(); }));
  const std::string said = lines_of(log).front();
  INFO(said);
  CHECK(said.find(part.string() + " " + cause) != std::string::npos);
  CHECK(said.find("it was ended") != std::string::npos);
  // What can be told before the process runs fails the restore itself.
  if (cause != "is missing") CHECK(restored.exit_code != 0);
  fs::remove(log, ec);
}

}  // namespace vmmckpt::test
