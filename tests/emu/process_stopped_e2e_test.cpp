// A program stopped by a signal (SIGSTOP, Ctrl-Z, a scheduler's suspend) is a state, not a trap (issue 49, case 1):
// dump --process, dump and suspend refuse it at once, saying so, whenever the stop comes, and leave it stopped and
// whole; an image that holds a stopped process (an older cuda-ckpt's) is refused by verify and restore at once.
#include <signal.h>

#include "process_support.hpp"
#include "vmmckpt/image/image.hpp"
#include "vmmckpt/support/hex_text.hpp"

namespace vmmckpt::test {
namespace {

// Nothing in dir is named image or image.partial-...
bool nothing_of(const fs::path& image) {
  for (const auto& entry : fs::directory_iterator(image.parent_path()))
    if (entry.path().filename().string().rfind(image.filename().string(), 0) == 0) return false;
  return true;
}

// The refusal names the stop and the way on.
void says_stopped(const std::string& out, pid_t pid) {
  CHECK(out.find("process " + std::to_string(pid) + " is stopped by a signal") != std::string::npos);
  CHECK(out.find("kill -CONT " + std::to_string(pid)) != std::string::npos);
}

// The program, stopped by someone, is left stopped; continued, it runs on whole (its GPU memory back: each tick
// checks its buffers), and a dump of it succeeds.
void continues_whole(ticker_tree& t) {
  CHECK(proc_state(t.pid) == 'T');
  REQUIRE(::kill(t.pid, SIGCONT) == 0);
  REQUIRE(t.goes_on({t.log}));
  CHECK(tick_problem(t.log).empty());
  const auto again =
      tool({"dump", std::to_string(t.pid), "--process", "--leave-running", "-o", (t.dir.path / "again").string()});
  INFO(describe(again));
  CHECK(again.exit_code == 0);
  REQUIRE(t.goes_on({t.log}));
}

// The first field `field` (length-delimited) of a protobuf message: its offset and length, or npos.
std::pair<std::size_t, std::size_t> field_at(const std::string& m, std::size_t from, std::size_t end, unsigned field) {
  auto varint = [&](std::size_t& at) {
    std::uint64_t v = 0;
    for (int shift = 0; at < end; shift += 7) {
      const auto b = static_cast<unsigned char>(m[at++]);
      v |= static_cast<std::uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) break;
    }
    return v;
  };
  for (std::size_t at = from; at < end;) {
    const std::uint64_t key = varint(at), wire = key & 7;
    if (wire == 0) {
      varint(at);
    } else if (wire == 2) {
      const std::uint64_t n = varint(at);
      if ((key >> 3) == field) return {at, n};
      at += n;
    } else {
      at += wire == 5 ? 4 : 8;
    }
  }
  return {std::string::npos, 0};
}

// Makes image's process look as an older cuda-ckpt dumped a stopped program: CRIU's core image of pid records
// TASK_STOPPED (3) instead of TASK_ALIVE (1), and process.json lists the file's new checksum.
void record_stopped(const fs::path& image, pid_t pid) {
  const fs::path core = image / "criu" / ("core-" + std::to_string(pid) + ".img");
  std::string bytes;
  {
    std::ifstream in(core, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  REQUIRE(bytes.size() > 12);
  const auto [task, size] = field_at(bytes, 12, bytes.size(), 3);  // core_entry.tc
  REQUIRE(task != std::string::npos);
  REQUIRE(bytes.substr(task, 2) == std::string("\x08\x01", 2));  // task_state = TASK_ALIVE, its first field
  bytes[task + 1] = 3;
  std::ofstream(core, std::ios::binary | std::ios::trunc) << bytes;
  image::streaming_checksum sum;
  sum.update(bytes.data(), bytes.size());
  std::ifstream in(image / "process.json");
  auto manifest = nlohmann::json::parse(in);
  for (auto& f : manifest.at("criu_files"))
    if (f.at("name") == core.filename().string()) f["checksum"] = hex16(sum.value());
  std::ofstream(image / "process.json", std::ios::trunc) << manifest.dump(2) << "\n";
}

}  // namespace

TEST_CASE("dump --process of a program stopped by a signal refuses at once, whenever the stop comes, and leaves it "
          "stopped and whole",
          "[process][stopped]") {
  REQUIRE_CRIU();
  ticker_tree t;
  const fs::path image = t.dir.path / "image";
  std::string at;
  SECTION("stopped before the dump") {}
  SECTION("stopped once its GPU memory is suspended") { at = "process:suspended"; }
  SECTION("stopped just before CRIU runs") { at = "process:intent"; }
  SECTION("stopped as CRIU starts: CRIU records it stopped") { at = "process:criu"; }
  const auto dump = tool_with_stop({"dump", std::to_string(t.pid), "--process", "-o", image.string()}, t.pid, at);
  const int code = dump->wait();
  INFO(dump->output());
  CHECK(code == 1);
  says_stopped(dump->output(), t.pid);
  CHECK(nothing_of(image));
  continues_whole(t);
}

TEST_CASE("dump and suspend of a program stopped by a signal refuse at once, saying so", "[process][stopped]") {
  ticker_tree t;
  REQUIRE(::kill(t.pid, SIGSTOP) == 0);
  REQUIRE(wait_until([&] { return proc_state(t.pid) == 'T'; }));
  for (const char* op : {"dump", "suspend"}) {
    // Bounded well below the deadline it waited out before (60 s for dump, 120 s for suspend).
    const auto r = run_process({cuda_ckpt, op, std::to_string(t.pid), "-o", (t.dir.path / op).string()}, {}, 30);
    INFO(describe(r));
    CHECK(r.exit_code == 1);
    says_stopped(r.err, t.pid);
    CHECK(nothing_of(t.dir.path / op));
  }
  REQUIRE(::kill(t.pid, SIGCONT) == 0);
  REQUIRE(t.goes_on({t.log}));
  CHECK(tick_problem(t.log).empty());
}

TEST_CASE("an image whose process was dumped stopped is refused by verify and restore at once, and nothing starts",
          "[process][stopped]") {
  REQUIRE_CRIU();
  ticker_tree t;
  const fs::path image = t.dir.path / "image";
  REQUIRE(tool({"dump", std::to_string(t.pid), "--process", "-o", image.string()}).exit_code == 0);
  REQUIRE(wait_gone(t.pid));
  REQUIRE(tool({"verify", image.string()}).exit_code == 0);
  record_stopped(image, t.pid);
  for (const char* op : {"verify", "restore"}) {
    // Before, restore waited 600 s for the stopped process to load its GPU memory.
    const auto r = run_process({cuda_ckpt, op, image.string()}, {}, 60);
    INFO(describe(r));
    CHECK(r.exit_code != 0);
    CHECK(r.signal == 0);  // it ended by itself, not at the bound
    CHECK((r.out + r.err).find("process " + std::to_string(t.pid) + " was stopped by a signal") != std::string::npos);
  }
  CHECK(::kill(t.pid, 0) != 0);  // nothing was restored
}

}  // namespace vmmckpt::test
