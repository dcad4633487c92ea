// Whole-process dumps and restores as transactions that cannot lose the program (issue 32): the tool killed
// while CRIU runs, a file system one inode short, a restore killed midway, a process.json naming a pid CRIU does
// not restore. Each time the program runs on, or `resume` brings it back, or its image is complete and `restore`
// brings it back, and `cuda-ckpt ps` says which.
#include <sys/mount.h>
#include <sys/statvfs.h>

#include "process_support.hpp"

namespace vmmckpt::test {
namespace {

// The unfinished image a killed dump left for `image` (IMAGE.partial-...), or empty.
fs::path partial_of(const fs::path& image) {
  for (const auto& entry : fs::directory_iterator(image.parent_path()))
    if (entry.path().filename().string().rfind(image.filename().string() + ".partial-", 0) == 0) return entry.path();
  return {};
}

// CRIU's dump, run on after its tool was killed, has ended (its exit status is in the unfinished image).
bool criu_dump_ended(const fs::path& image) {
  return wait_until(
      [&] {
        const fs::path partial = partial_of(image);
        return !partial.empty() && fs::exists(partial / "criu-dump.status");
      },
      60);
}

// What `ps --json` says of the interrupted operation on `pid`: its entry, or null. Waits up to `seconds` for
// one (CRIU may still run for a killed tool a moment after its work is visible: ps says nothing until it ends).
nlohmann::json interrupted_entry(pid_t pid, int seconds = 0) {
  nlohmann::json found = nullptr;
  wait_until(
      [&] {
        const auto r = tool({"ps", "--json"});
        if (r.exit_code == 0)
          for (const auto& e : nlohmann::json::parse(r.out))
            if (e.value("status", "") == "interrupted" && e.value("pid", 0) == pid) found = e;
        return found.is_object() || seconds == 0;
      },
      seconds);
  return found;
}

// The records (in root's default suspend directory) of whole-process operations on `pid`.
std::vector<fs::path> records_of(pid_t pid) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/dev/shm/vmmckpt-" + std::to_string(::geteuid()), ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("whole-process-", 0) == 0 && name.find("-" + std::to_string(pid) + "-") != std::string::npos)
      out.push_back(entry.path());
  }
  return out;
}

}  // namespace

TEST_CASE("dump --process killed while criu dump runs: the program is not lost, ps names resume, resume brings it back",
          "[process][transaction][leftovers]") {
  REQUIRE_CRIU();
  ticker_tree t;
  const fs::path image = t.dir.path / "image";
  const auto killed = tool({"dump", std::to_string(t.pid), "--process", "-o", image.string()},
                           {{"VMMCKPT_TEST_FAULT", "process:criu-running"}});
  CHECK(killed.signal == SIGKILL);
  REQUIRE(criu_dump_ended(image));
  // CRIU went on alone; it leaves the program stopped, never ends it.
  CHECK(::kill(t.pid, 0) == 0);
  CHECK(nothing_named(image));
  const auto entry = interrupted_entry(t.pid, 30);
  INFO(entry.dump());
  REQUIRE(entry.is_object());
  CHECK(entry["outcome"] == "resume");
  CHECK(entry["way_back"] == "cuda-ckpt resume " + std::to_string(t.pid));
  CHECK(tool({"ps", std::to_string(t.pid)}).out.find("way back: cuda-ckpt resume " + std::to_string(t.pid)) !=
        std::string::npos);
  const auto resumed = tool({"resume", std::to_string(t.pid)});
  INFO(describe(resumed));
  CHECK(resumed.exit_code == 0);
  CHECK(resumed.out.find("left process " + std::to_string(t.pid) + " stopped") != std::string::npos);
  REQUIRE(t.goes_on({t.log}));
  CHECK(tick_problem(t.log).empty());
  CHECK(interrupted_entry(t.pid).is_null());
  // The snapshot CRIU took is complete: gc completes it under its name (never removes it), and it verifies.
  const auto gc = tool({"gc", t.dir.path.string()});
  INFO(describe(gc));
  CHECK(gc.out.find("completed from image.partial-") != std::string::npos);
  CHECK(tool({"verify", image.string()}).exit_code == 0);
  CHECK(records_of(t.pid).empty());
}

TEST_CASE("dump --process killed after CRIU and its program killed: restore DIR finds the image under its other name",
          "[process][transaction][leftovers]") {
  REQUIRE_CRIU();
  ticker_tree t;
  const fs::path image = t.dir.path / "image";
  const auto killed = tool({"dump", std::to_string(t.pid), "--process", "-o", image.string()},
                           {{"VMMCKPT_TEST_FAULT", "process:criu-dumped"}});
  CHECK(killed.signal == SIGKILL);
  // Someone ends the stopped program: the unfinished image is now its only copy.
  ::kill(t.pid, SIGKILL);
  REQUIRE(wait_gone(t.pid));
  const std::uint64_t at_dump = last_tick(t.log);
  const auto entry = interrupted_entry(t.pid, 30);
  INFO(entry.dump());
  REQUIRE(entry.is_object());
  CHECK(entry["outcome"] == "restore");
  CHECK(entry["way_back"] == "cuda-ckpt restore " + image.string());
  const auto restored = tool({"restore", image.string(), "--json"});
  INFO(describe(restored));
  REQUIRE(restored.exit_code == 0);
  CHECK(nlohmann::json::parse(restored.out)["pid"] == t.pid);
  CHECK(fs::exists(image / "process.json"));
  CHECK(partial_of(image).empty());
  REQUIRE(t.goes_on({t.log}));
  CHECK(last_tick(t.log) > at_dump);
  CHECK(tick_problem(t.log).empty());
  // Nothing is left to recover: the record goes with gc.
  tool({"gc", t.dir.path.string()});
  CHECK(records_of(t.pid).empty());
  t.stop({t.log});
}

TEST_CASE(
    "dump --process into a file system some inodes short: it fails before the image or completes, and the program "
    "is never lost",
    "[process][transaction][leftovers]") {
  REQUIRE_CRIU();
  ticker_tree t;
  const fs::path small = t.dir.path / "small";
  fs::create_directory(small);
  auto mount_with = [&](int inodes) {
    return ::mount("vmmckpt-inodes", small.c_str(), "tmpfs", 0,
                   ("size=256m,mode=0700,nr_inodes=" + std::to_string(inodes)).c_str()) == 0;
  };
  if (!mount_with(100000)) VMMCKPT_SKIP("cannot mount a tmpfs here");
  // What a complete image takes, in inodes (the file system's root is one).
  REQUIRE(tool({"dump", std::to_string(t.pid), "--process", "--leave-running", "-o", (small / "probe").string()})
              .exit_code == 0);
  struct statvfs v {};
  REQUIRE(::statvfs(small.c_str(), &v) == 0);
  const int used = static_cast<int>(v.f_files - v.f_ffree);
  ::umount2(small.c_str(), MNT_DETACH);
  REQUIRE(t.goes_on({t.log}));
  int failed_late = 0;
  // One short of what the image takes at its peak (process.json's temporary name while the intent record is
  // still there), and fewer.
  for (int inodes = used; inodes >= used - 3; --inodes) {
    INFO("inodes " << inodes << " of " << used + 1);
    REQUIRE(mount_with(inodes));
    const fs::path image = small / "image";
    const auto r = tool({"dump", std::to_string(t.pid), "--process", "-o", image.string()});
    INFO(describe(r));
    if (r.exit_code == 0) {
      // Complete after all: the program ended with the dump, and comes back from the image.
      REQUIRE(wait_gone(t.pid));
      REQUIRE(tool({"verify", image.string()}).exit_code == 0);
      REQUIRE(tool({"restore", image.string()}).exit_code == 0);
    } else {
      CHECK(r.exit_code == 1);
      CHECK(r.err.find("the process goes on as before") != std::string::npos);
      failed_late += r.err.find("process.json") != std::string::npos;
      CHECK(nothing_named(image));
      CHECK(partial_of(image).empty());
    }
    CHECK(::kill(t.pid, 0) == 0);
    REQUIRE(t.goes_on({t.log}));
    CHECK(tick_problem(t.log).empty());
    CHECK(records_of(t.pid).empty());
    ::umount2(small.c_str(), MNT_DETACH);
  }
  // At least one dump failed writing the manifest, after CRIU had done its part: where the program was lost before.
  CHECK(failed_late > 0);
}

TEST_CASE("restore DIR killed while criu restore runs: the process waits, ps names resume, resume finds its image",
          "[process][transaction][leftovers]") {
  REQUIRE_CRIU();
  ticker_tree t;
  const fs::path image = t.dir.path / "image";
  REQUIRE(tool({"dump", std::to_string(t.pid), "--process", "-o", image.string()}).exit_code == 0);
  REQUIRE(wait_gone(t.pid));
  const bool without_record = GENERATE(false, true);
  INFO((without_record ? "the record removed: found by its name" : "found through the record"));
  const auto killed = tool({"restore", image.string()}, {{"VMMCKPT_TEST_FAULT", "restore:criu-running"}});
  CHECK(killed.signal == SIGKILL);
  // CRIU goes on alone and brings the process back; its GPU memory is not loaded: it waits, suspended.
  REQUIRE(
      wait_until([&] { return ::kill(t.pid, 0) == 0 && listed_state(t.pid).value("state", "") == "suspended"; }, 60));
  const auto entry = interrupted_entry(t.pid, 30);
  INFO(entry.dump());
  REQUIRE(entry.is_object());
  CHECK(entry["operation"] == "restore");
  CHECK(entry["way_back"] == "cuda-ckpt resume " + std::to_string(t.pid));
  // Its suspend wrote its GPU part under the dump's unfinished name, since renamed to `image`.
  if (without_record)
    for (const auto& r : records_of(t.pid)) fs::remove(r);
  const auto resumed = tool({"resume", std::to_string(t.pid)});
  INFO(describe(resumed));
  CHECK(resumed.exit_code == 0);
  CHECK(resumed.out.find((image / "gpu" / std::to_string(t.pid)).string()) != std::string::npos);
  REQUIRE(t.goes_on({t.log}));
  CHECK(tick_problem(t.log).empty());
  CHECK(interrupted_entry(t.pid).is_null());
  CHECK(records_of(t.pid).empty());
  t.stop({t.log});
}

TEST_CASE("restore DIR refuses a process.json that names a pid CRIU does not restore, before anything starts",
          "[process][transaction][leftovers]") {
  REQUIRE_CRIU();
  ticker_tree t;
  const fs::path image = t.dir.path / "image";
  REQUIRE(tool({"dump", std::to_string(t.pid), "--process", "-o", image.string()}).exit_code == 0);
  REQUIRE(wait_gone(t.pid));
  auto j = nlohmann::json::parse(std::ifstream(image / "process.json"));
  const pid_t other = t.pid + 7;
  SECTION("a process of the tree") {
    j["processes"][0]["pid"] = other;
    fs::rename(image / "gpu" / std::to_string(t.pid), image / "gpu" / std::to_string(other));
    std::ofstream(image / "process.json") << j.dump(2);
    const auto r = tool({"restore", image.string()});
    INFO(describe(r));
    CHECK(r.exit_code == 1);
    CHECK(r.err.find("process " + std::to_string(other) + " is not one CRIU's image restores") != std::string::npos);
  }
  SECTION("the root") {
    j["root_pid"] = other;
    std::ofstream(image / "process.json") << j.dump(2);
    const auto r = tool({"restore", image.string()});
    INFO(describe(r));
    CHECK(r.exit_code == 1);
    CHECK(r.err.find("CRIU's image restores process " + std::to_string(t.pid) + " as its root") != std::string::npos);
  }
  // Nothing was started: the process CRIU would have brought back is not left waiting.
  CHECK(::kill(t.pid, 0) != 0);
  CHECK(records_of(t.pid).empty());
}


TEST_CASE("dump --process --leave-running killed after its resume request: no way back is named, and once the "
          "program ends no record is left",
          "[process][transaction][leftovers]") {
  REQUIRE_CRIU();
  // The program takes a while over loading its memory (it says suspended until it is loaded).
  ::setenv("VMMCKPT_TEST_FAULT", "program:resuming=pause:3000", 1);
  ticker_tree t;
  ::unsetenv("VMMCKPT_TEST_FAULT");
  const fs::path image = t.dir.path / "image";
  const auto killed = tool({"dump", std::to_string(t.pid), "--process", "--leave-running", "-o", image.string()},
                           {{"VMMCKPT_TEST_FAULT", "requested:resume"}});
  CHECK(killed.signal == SIGKILL);
  const auto loading = interrupted_entry(t.pid);
  INFO(loading.dump());
  CHECK(loading.is_null());  // it is loading its memory: a resume asked for now would be refused once it runs
  // The program took the resume: it runs with its memory, and the image is complete.
  REQUIRE(t.goes_on({t.log}));
  CHECK(listed_state(t.pid).at("state") == "running");
  CHECK(tool({"verify", image.string()}).exit_code == 0);
  const auto running = interrupted_entry(t.pid);
  INFO(running.dump());
  CHECK(running.is_null());  // never `resume`: it is not suspended
  // It ends on its own: it ran on after the dump, so its end is not the dump's, and nothing names `restore`.
  ::kill(t.pid, SIGKILL);
  REQUIRE(wait_gone(t.pid));
  const auto ended = interrupted_entry(t.pid);
  INFO(ended.dump());
  CHECK(ended.is_null());
  const auto gc = tool({"gc", t.dir.path.string()});
  INFO(describe(gc));
  CHECK(records_of(t.pid).empty());
  CHECK(tool({"verify", image.string()}).exit_code == 0);  // gc leaves the image
}

}  // namespace vmmckpt::test
