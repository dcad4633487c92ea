// Whole-process checkpoints end to end (cuda-ckpt dump --process, restore DIR) on the emulated driver, with
// real CRIU: emu_ticker's GPU buffers and CPU tick counter must go on together after a restore, and every
// failure leaves the program running and no image.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "process.hpp"
#include "process_support.hpp"
#include "vmmckpt/protocol/protocol.hpp"

namespace vmmckpt::test {
namespace {

// An image of t (whose program ended with the dump at tick at_dump) verifies and restores; the program goes on
// from there, and its still buffer is checked when it stops.
void restore_goes_on(ticker_tree& t, const fs::path& image, std::uint64_t at_dump) {
  CHECK(tool({"verify", image.string()}).exit_code == 0);
  const auto restored = tool({"restore", image.string(), "--json"});
  INFO(describe(restored));
  REQUIRE(restored.exit_code == 0);
  REQUIRE(t.goes_on({t.log}));
  CHECK(last_tick(t.log) > at_dump);
  t.stop({t.log});
  CHECK(tick_problem(t.log).empty());
  REQUIRE(wait_gone(t.pid));
}

}  // namespace

TEST_CASE("a whole process tree killed after dump --process comes back with restore DIR and goes on", "[process]") {
  REQUIRE_CRIU();
  ticker_tree t({"--children", "1"});
  const fs::path child_log = t.log.string() + ".1";
  REQUIRE(wait_until([&] { return last_tick(child_log) >= 3; }));
  const fs::path image = t.dir.path / "image";
  const auto dumped = tool({"dump", std::to_string(t.pid), "--process", "-o", image.string(), "--json"});
  REQUIRE(dumped.exit_code == 0);
  INFO(describe(dumped));
  const auto out = nlohmann::json::parse(dumped.out);
  CHECK(out["processes"].size() == 2);
  CHECK(out["left_running"] == false);
  CHECK(out["stopped_seconds"].get<double>() > 0);
  REQUIRE(wait_gone(t.pid));  // it ends, as with criu dump
  const std::uint64_t at_dump = last_tick(t.log);

  const auto verified = tool({"verify", image.string()});
  CHECK(verified.exit_code == 0);
  INFO(describe(verified));
  const auto inspected = tool({"inspect", image.string()});
  CHECK(inspected.exit_code == 0);
  CHECK(inspected.out.find("whole-process image") != std::string::npos);

  const auto restored = tool({"restore", image.string(), "--json"});
  INFO(describe(restored));
  REQUIRE(restored.exit_code == 0);
  CHECK(nlohmann::json::parse(restored.out)["pid"] == t.pid);
  REQUIRE(t.goes_on({t.log, child_log}));
  CHECK(last_tick(t.log) > at_dump);
  CHECK(tick_problem(t.log).empty());
  CHECK(tick_problem(child_log).empty());
  t.stop({t.log, child_log});
  CHECK(tick_problem(t.log).empty());
  CHECK(tick_problem(child_log).empty());
}

TEST_CASE("dump --process --leave-running: the process goes on, and the image restores it later", "[process]") {
  REQUIRE_CRIU();
  ticker_tree t;
  const fs::path image = t.dir.path / "image";
  const auto dumped = tool({"dump", std::to_string(t.pid), "--process", "--leave-running", "-o", image.string()});
  INFO(describe(dumped));
  REQUIRE(dumped.exit_code == 0);
  CHECK(dumped.out.find("it goes on") != std::string::npos);
  REQUIRE(t.goes_on({t.log}));

  // Its pid is still taken: CRIU cannot give it back, and the image stays as it was.
  const auto taken = tool({"restore", image.string()});
  CHECK(taken.exit_code == 1);
  CHECK(taken.err.find("pid " + std::to_string(t.pid) + " is in use") != std::string::npos);
  CHECK(tool({"verify", image.string()}).exit_code == 0);

  t.stop({t.log});
  REQUIRE(wait_gone(t.pid));
  fs::remove(t.log.string() + ".stop");
  const std::uint64_t stopped_at = last_tick(t.log);
  const auto restored = tool({"restore", image.string()});
  INFO(describe(restored));
  REQUIRE(restored.exit_code == 0);
  CHECK(std::stoi(restored.out) == t.pid);
  // The ticks start again from the dump's, below where the first run stopped.
  REQUIRE(wait_until([&] { return lines_of(t.log).back().rfind("tick ", 0) == 0; }));
  CHECK(last_tick(t.log) <= stopped_at + 2);
  REQUIRE(t.goes_on({t.log}));
  CHECK(tick_problem(t.log).empty());
  t.stop({t.log});
}

TEST_CASE("dump --process --parent: GPU parts incremental on a whole-process image, restored through the chain",
          "[process][incremental]") {
  REQUIRE_CRIU();
  ticker_tree t({"--still", std::to_string(8 << 20)});  // 8 MiB written once, 4 MiB rewritten every tick
  const fs::path family = t.dir.path / "images";
  fs::create_directories(family);
  const fs::path full = family / "full", inc = family / "inc";
  const auto first =
      tool({"dump", std::to_string(t.pid), "--process", "--leave-running", "-o", full.string(), "--json"});
  INFO(describe(first));
  REQUIRE(first.exit_code == 0);
  const auto full_bytes = nlohmann::json::parse(first.out)["gpu_bytes"].get<std::uint64_t>();
  CHECK(full_bytes >= (12u << 20));

  // Refused before the process is touched: a parent that is no whole-process image, or is missing.
  const auto not_process = tool({"dump", std::to_string(t.pid), "--process", "--leave-running", "--parent",
                                 (full / "gpu" / std::to_string(t.pid)).string(), "-o", (family / "bad").string()});
  CHECK(not_process.exit_code == 1);
  CHECK(not_process.err.find("not a whole-process image") != std::string::npos);
  const auto missing = tool({"dump", std::to_string(t.pid), "--process", "--leave-running", "--parent",
                             (family / "nothing").string(), "-o", (family / "bad").string()});
  CHECK(missing.exit_code == 1);
  CHECK(nothing_named(family / "bad"));
  REQUIRE(t.goes_on({t.log}));

  const auto second =
      tool({"dump", std::to_string(t.pid), "--process", "--parent", full.string(), "-o", inc.string(), "--json"});
  INFO(describe(second));
  REQUIRE(second.exit_code == 0);
  const auto out = nlohmann::json::parse(second.out);
  CHECK(out["parent"] == "full");
  // The still buffer's blocks are left to the parent: the GPU part holds about the rewritten buffers only.
  CHECK(out["gpu_bytes"].get<std::uint64_t>() + (8u << 20) <= full_bytes);
  REQUIRE(wait_gone(t.pid));
  const std::uint64_t at_dump = last_tick(t.log);

  // The parent cannot be removed while the child needs it; the child's inspect names it.
  const auto rm = tool({"rm", full.string()});
  CHECK(rm.exit_code == 1);
  CHECK(rm.err.find("is the parent of " + inc.string()) != std::string::npos);
  CHECK(fs::exists(full / "process.json"));
  CHECK(tool({"inspect", inc.string()}).out.find("parent    full") != std::string::npos);

  // Moved together, the family keeps its chain: the child finds its parts' parents next to it.
  const fs::path moved = t.dir.path / "moved";
  fs::rename(family, moved);
  restore_goes_on(t, moved / "inc", at_dump);  // the parent's blocks came back

  // Without its parent the child is refused, naming it, and nothing is started.
  fs::rename(moved / "full", t.dir.path / "elsewhere");
  const auto orphan = tool({"restore", (moved / "inc").string()});
  INFO(describe(orphan));
  CHECK(orphan.exit_code != 0);
  CHECK(orphan.err.find("parent") != std::string::npos);
  CHECK(orphan.err.find("missing") != std::string::npos);
  CHECK(::kill(t.pid, 0) != 0);
}

TEST_CASE("dump --process --pre-copy: the GPU parts dumped while the process runs, the stop writes what changed",
          "[process][incremental]") {
  REQUIRE_CRIU();
  ticker_tree t({"--still", std::to_string(8 << 20)});  // 8 MiB written once, 4 MiB rewritten every tick
  const fs::path family = t.dir.path / "images";
  fs::create_directories(family);
  const fs::path first = family / "first", second = family / "second";
  const std::string pre_part = std::to_string(t.pid) + ".pre";

  const auto one = tool(
      {"dump", std::to_string(t.pid), "--process", "--pre-copy", "--leave-running", "-o", first.string(), "--json"});
  INFO(describe(one));
  REQUIRE(one.exit_code == 0);
  const auto out = nlohmann::json::parse(one.out);
  CHECK(out["pre_copied"] == true);
  const auto pre_bytes = out["pre_copy_bytes"].get<std::uint64_t>();
  CHECK(pre_bytes >= (12u << 20));
  // The still buffer was not written again: the stop left it to the pre-copied part.
  CHECK(out["held_bytes"].get<std::uint64_t>() + (8u << 20) <= pre_bytes);
  CHECK(out["gpu_bytes"].get<std::uint64_t>() == pre_bytes + out["held_bytes"].get<std::uint64_t>());
  CHECK(fs::is_directory(first / "gpu" / pre_part));
  CHECK(nlohmann::json::parse(std::ifstream(first / "process.json"))["version"] == 2);
  CHECK(tool({"inspect", first.string()}).out.find("pre-copied while it ran") != std::string::npos);
  CHECK(tool({"verify", first.string()}).exit_code == 0);
  REQUIRE(t.goes_on({t.log}));

  // On top of a parent: the pre-copy itself is incremental on the parent's part.
  const auto two = tool({"dump", std::to_string(t.pid), "--process", "--pre-copy", "--parent", first.string(), "-o",
                         second.string(), "--json"});
  INFO(describe(two));
  REQUIRE(two.exit_code == 0);
  CHECK(nlohmann::json::parse(two.out)["pre_copy_bytes"].get<std::uint64_t>() + (8u << 20) <= pre_bytes);
  REQUIRE(wait_gone(t.pid));
  const std::uint64_t at_dump = last_tick(t.log);

  // A pre-copied part is the image's own: a stray or missing one is refused, as any other part.
  fs::rename(second / "gpu" / pre_part, t.dir.path / "aside");
  const auto without = tool({"verify", second.string()});
  CHECK(without.exit_code != 0);
  CHECK(without.err.find(pre_part) != std::string::npos);
  fs::rename(t.dir.path / "aside", second / "gpu" / pre_part);

  // Moved together, the family keeps both chains (part -> pre-copied part -> the parent's part).
  const fs::path moved = t.dir.path / "moved";
  fs::rename(family, moved);
  restore_goes_on(t, moved / "second", at_dump);  // the still buffer came back through both chains

  // Without the parent image the pre-copied part's parent is missing, and that is what is said (the part
  // beside it of the parent's name is its own child, not its parent).
  fs::rename(moved / "first", t.dir.path / "elsewhere");
  const auto orphan = tool({"verify", (moved / "second").string()});
  INFO(describe(orphan));
  CHECK(orphan.exit_code != 0);
  CHECK(orphan.err.find("missing") != std::string::npos);
  CHECK(orphan.err.find("cycle") == std::string::npos);

  CHECK(tool({"dump", std::to_string(::getpid()), "--pre-copy"}).err.find("apply to whole-process dumps") !=
        std::string::npos);
}

TEST_CASE("dump --process killed at each step: cuda-ckpt resume brings the process back, and no image is left",
          "[process][fault][leftovers]") {
  REQUIRE_CRIU();
  // "pre-copy " first: the dump with --pre-copy.
  std::string point =
      GENERATE("process:suspended", "process:locked", "process:checkpointed", "process:intent", "process:criu-dumped",
               "process:written", "pre-copy process:pre-copied", "pre-copy process:suspended");
  INFO(point);
  std::vector<std::string> args{"--process", "--leave-running"};
  if (point.rfind("pre-copy ", 0) == 0) {
    args.push_back("--pre-copy");
    point = point.substr(9);
  }
  ticker_tree t;
  const fs::path image = t.dir.path / "image";
  args.insert(args.begin(), {"dump", std::to_string(t.pid)});
  args.insert(args.end(), {"-o", image.string()});
  const auto killed = tool(args, {{"VMMCKPT_TEST_FAULT", point}});
  CHECK(killed.signal == SIGKILL);
  CHECK(nothing_named(image));
  // The tool left the process suspended (from the driver's checkpoint on, checkpointed by the driver; from
  // CRIU's dump on, stopped by CRIU): resume undoes whatever it finds. gc keeps the unfinished image meanwhile.
  // Killed after the pre-copy the process was never held: nothing needs the unfinished image, and resume has
  // nothing to do.
  const bool held = point != "process:pre-copied";
  const auto kept = tool({"gc", t.dir.path.string(), "--json"});
  INFO(describe(kept));
  if (held) {
    CHECK(kept.out.find("an unfinished whole-process image") != std::string::npos);
    CHECK(kept.out.find("image.partial-") != std::string::npos);
  }
  const auto resumed = tool({"resume", std::to_string(t.pid)});
  INFO(describe(resumed));
  if (held)
    CHECK(resumed.exit_code == 0);
  else
    CHECK(resumed.err.find("is not suspended (state running)") != std::string::npos);
  if (point == "process:locked")
    CHECK(resumed.out.find("the driver had it locked") != std::string::npos);
  else if (held && point != "process:suspended")
    CHECK(resumed.out.find("restored and unlocked") != std::string::npos);
  if (point == "process:criu-dumped" || point == "process:written")
    CHECK(resumed.out.find("stopped") != std::string::npos);
  REQUIRE(t.goes_on({t.log}));
  CHECK(tick_problem(t.log).empty());
  // Nothing depends on what the killed tool left: gc removes it, or, where CRIU had done its part, completes it
  // under its name (a good image of the process as it was).
  CHECK(tool({"gc", t.dir.path.string()}).exit_code == 0);
  for (const auto& entry : fs::directory_iterator(t.dir.path))
    CHECK(entry.path().filename().string().find("image.partial-") == std::string::npos);
  if (point == "process:criu-dumped" || point == "process:written")
    CHECK(tool({"verify", image.string()}).exit_code == 0);
  else
    CHECK(nothing_named(image));
}

TEST_CASE("dump --process refused or failing leaves the process running and no image", "[process][fault]") {
  REQUIRE_CRIU();
  ticker_tree t;
  const fs::path image = t.dir.path / "image";
  SECTION("CRIU fails") {
    const fs::path failing = t.dir.path / "failing-criu";
    std::ofstream(failing) << "#!/bin/sh\n"
                              "case \"$1\" in --version) exec \"$REAL_CRIU\" --version;; esac\n"
                              "echo 'Error (test): criu was told to fail' >&2; exit 1\n";
    fs::permissions(failing, fs::perms::owner_all);
    const auto r = tool({"dump", std::to_string(t.pid), "--process", "-o", image.string()},
                        {{"VMMCKPT_CRIU", failing.string()}, {"REAL_CRIU", criu_for_tests()}});
    CHECK(r.exit_code == 1);
    CHECK(r.err.find("criu dump failed") != std::string::npos);
    CHECK(r.err.find("criu was told to fail") != std::string::npos);
    CHECK(r.err.find("the process goes on") != std::string::npos);
  }
  SECTION("no CRIU") {
    const auto r = tool({"dump", std::to_string(t.pid), "--process", "-o", image.string()},
                        {{"VMMCKPT_CRIU", "/nonexistent/criu"}});
    CHECK(r.exit_code == 1);
    CHECK(r.err.find("provision-criu.sh") != std::string::npos);
  }
  SECTION("CRIU too old") {
    const fs::path old_criu = t.dir.path / "old-criu";
    std::ofstream(old_criu) << "#!/bin/sh\necho 'Version: 3.17.1'\n";
    fs::permissions(old_criu, fs::perms::owner_all);
    const auto r =
        tool({"dump", std::to_string(t.pid), "--process", "-o", image.string()}, {{"VMMCKPT_CRIU", old_criu.string()}});
    CHECK(r.exit_code == 1);
    CHECK(r.err.find("is CRIU 3.17.1, too old") != std::string::npos);
  }
  SECTION("a driver without the checkpoint API") {
    const auto r = tool({"dump", std::to_string(t.pid), "--process", "-o", image.string()},
                        {{"VMMCKPT_EMU_NO_CHECKPOINT_API", "1"}});
    CHECK(r.exit_code == 1);
    CHECK(r.err.find("does not support process checkpoints") != std::string::npos);
  }
  CHECK(nothing_named(image));
  for (const auto& entry : fs::directory_iterator(t.dir.path))
    CHECK(entry.path().filename().string().find("image.partial-") == std::string::npos);
  REQUIRE(t.goes_on({t.log}));
  CHECK(tick_problem(t.log).empty());
}

TEST_CASE(
    "dump --process: a client connected to the program's control socket while CRIU runs costs a retry, not the dump",
    "[process]") {
  REQUIRE_CRIU();
  ticker_tree t;
  // A client (as `cuda-ckpt ps` is while it is answered) connected to the program's control socket: CRIU
  // refuses to dump half of a connection ("External socket is used").
  const int client = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(client >= 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string path = protocol::socket_path(t.pid);
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  REQUIRE(::connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  const fs::path image = t.dir.path / "image";
  background_process dump(
      {cuda_ckpt, "dump", std::to_string(t.pid), "--process", "--leave-running", "-o", image.string(), "--json"}, {},
      /*stderr_too=*/true);
  // The client goes once CRIU has met it.
  const bool met = wait_until([&] {
    for (const auto& entry : fs::directory_iterator(t.dir.path))
      if (entry.path().filename().string().rfind("image.partial-", 0) == 0)
        for (const auto& line : lines_of(entry.path() / "criu-dump.log"))
          if (line.find("External socket is used") != std::string::npos) return true;
    return false;
  });
  ::close(client);
  CHECK(met);
  INFO(dump.output());
  CHECK(dump.wait() == 0);
  CHECK(tool({"verify", image.string()}).exit_code == 0);
  REQUIRE(t.goes_on({t.log}));
  CHECK(tick_problem(t.log).empty());
  t.stop({t.log});
}

TEST_CASE("dump --process refuses a tree with a process that uses CUDA without the shim", "[process]") {
  REQUIRE_CRIU();
  ticker_tree t({"--bare-child"});
  REQUIRE(wait_until([&] { return last_tick(t.log.string() + ".bare") >= 1; }));
  const fs::path image = t.dir.path / "image";
  const auto r = tool({"dump", std::to_string(t.pid), "--process", "-o", image.string()});
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("uses CUDA without vmmckpt") != std::string::npos);
  CHECK(nothing_named(image));
  REQUIRE(t.goes_on({t.log}));
}

TEST_CASE("restore DIR refuses a damaged CPU part and the wrong forms, and changes nothing", "[process]") {
  REQUIRE_CRIU();
  ticker_tree t;
  const fs::path image = t.dir.path / "image";
  REQUIRE(tool({"dump", std::to_string(t.pid), "--process", "-o", image.string()}).exit_code == 0);
  REQUIRE(wait_gone(t.pid));

  // With a command: the whole-process form is named.
  const auto with_command = tool({"restore", image.string(), "--", "/bin/true"});
  CHECK(with_command.exit_code == 2);
  CHECK(with_command.err.find("whole-process image") != std::string::npos);
  // A GPU-only image and no command: the command form is named.
  const auto gpu_only = tool({"restore", (image / "gpu" / std::to_string(t.pid)).string()});
  CHECK(gpu_only.exit_code == 2);
  CHECK(gpu_only.err.find("-- COMMAND") != std::string::npos);
  // No CRIU: what to install.
  const auto no_criu = tool({"restore", image.string()}, {{"VMMCKPT_CRIU", "/nonexistent/criu"}});
  CHECK(no_criu.exit_code == 1);
  CHECK(no_criu.err.find("provision-criu.sh") != std::string::npos);
  // A driver without the checkpoint API cannot restore the contexts it checkpointed.
  const auto no_api = tool({"restore", image.string()}, {{"VMMCKPT_EMU_NO_CHECKPOINT_API", "1"}});
  CHECK(no_api.exit_code == 1);
  CHECK(no_api.err.find("does not support process checkpoints") != std::string::npos);
  CHECK(::kill(t.pid, 0) != 0);

  // One byte of the CPU part's biggest file changed.
  fs::path biggest;
  for (const auto& entry : fs::directory_iterator(image / "criu"))
    if (biggest.empty() || entry.file_size() > fs::file_size(biggest)) biggest = entry.path();
  flip_byte(biggest, fs::file_size(biggest) / 2);
  const auto verified = tool({"verify", image.string()});
  CHECK(verified.exit_code == 1);
  CHECK((verified.out + verified.err).find(biggest.filename().string()) != std::string::npos);
  const auto refused = tool({"restore", image.string()});
  CHECK(refused.exit_code == 1);
  CHECK(refused.err.find("the CPU part is damaged") != std::string::npos);
  CHECK(::kill(t.pid, 0) != 0);                    // nothing was started
  flip_byte(biggest, fs::file_size(biggest) / 2);  // repaired: the image was not changed otherwise
  CHECK(tool({"verify", image.string()}).exit_code == 0);
}

}  // namespace vmmckpt::test

namespace vmmckpt::test {

TEST_CASE("the Slurm recipe: the warning signal dumps the job whole, the next allocation restores it",
          "[process][slurm]") {
  REQUIRE_CRIU();
  scratch_dir dir;
  const fs::path log = dir.path / "log", images = dir.path / "ckpt";
  const std::string script = std::string(VMMCKPT_SOURCE_DIR) + "/scripts/slurm-preempt.sh";
  const std::map<std::string, std::string> env{{"CUDA_CKPT", cuda_ckpt}, {"SLURM_JOB_ID", ""}};
  const std::string job =
      "exec " + script + " --image-dir " + images.string() + " -- " + ticker + " " + log.string() + " 2>&1";

  // First allocation: the job starts; Slurm's warning (here sent by hand) checkpoints it.
  pid_t program = 0;
  {
    background_process first({"/bin/sh", "-c", job}, env);
    REQUIRE(first.wait_for_output("started process "));
    REQUIRE(wait_until([&] { return last_tick(log) >= 3; }));
    const auto& out = first.output();
    program = std::stoi(out.substr(out.find("started process ") + 16));
    ::kill(first.pid(), SIGUSR1);
    CHECK(first.wait_for_output("not in a Slurm job: run this script again to restore it"));
    CHECK(first.wait() == 0);
  }
  REQUIRE(wait_gone(program));
  CHECK(fs::exists(images / "image" / "process.json"));
  const std::uint64_t at_checkpoint = last_tick(log);

  // Next allocation: the same job script restores it; it goes on and ends by itself.
  background_process second({"/bin/sh", "-c", job}, env);
  REQUIRE(second.wait_for_output("restored process " + std::to_string(program)));
  REQUIRE(wait_until([&] { return last_tick(log) >= at_checkpoint + 5; }));
  std::ofstream(log.string() + ".stop").put('\n');
  // The restored program ends as this test's child (its subreaper): reaped while the script waits.
  REQUIRE(wait_gone(program));
  CHECK(second.wait_for_output("the job is done"));
  CHECK(second.wait() == 0);
  CHECK(tick_problem(log).empty());
  CHECK_FALSE(fs::exists(images / "image"));  // the job is done: its image goes
}

}  // namespace vmmckpt::test
