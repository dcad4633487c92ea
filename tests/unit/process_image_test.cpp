// The whole-process image reader against hostile input: process.json's numbers, links and special files in the
// image, sizes checked before reading, CRIU's pstree.img, and the ownership rule root restores by.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "skip.hpp"
#include "vmmckpt/ckpt/criu.hpp"
#include "vmmckpt/ckpt/image_owner.hpp"
#include "vmmckpt/ckpt/process_image.hpp"
#include "vmmckpt/support/hex_text.hpp"
#include "vmmckpt/image/image.hpp"

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using vmmckpt::image::image_error;
namespace ckpt = vmmckpt::ckpt;

namespace {

struct temp_dir {
  fs::path path;
  temp_dir() {
    char pattern[] = "/tmp/vmmckpt-unit-XXXXXX";
    REQUIRE(::mkdtemp(pattern) != nullptr);
    path = pattern;
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

void write(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

// A process.json as dump --process writes it, with one CRIU file of `criu_bytes` bytes.
nlohmann::json good_manifest(const std::string& criu_bytes = "abc") {
  return {{"format", "vmmckpt-process"},
          {"version", 1},
          {"tool_version", "0.1"},
          {"created", "2026-11-26T00:00:00Z"},
          {"host", "h"},
          {"root_pid", 100},
          {"criu_version", "4.1.1"},
          {"gpu_bytes", 0},
          {"stopped_seconds", 0.5},
          {"left_running", false},
          {"processes",
           {{{"pid", 100}, {"parent", 1}, {"command", {"prog"}}, {"image_id", "id"}, {"driver_checkpointed", true}}}},
          {"criu_files",
           {{{"name", "pstree.img"},
             {"bytes", criu_bytes.size()},
             {"checksum", vmmckpt::hex16(vmmckpt::image::block_checksum(criu_bytes.data(), criu_bytes.size()))}}}}};
}

std::string parse_error(const nlohmann::json& j) {
  try {
    ckpt::parse_process_manifest(j.dump(), "process.json");
  } catch (const image_error& e) {
    return e.what();
  }
  return "";
}

// An image directory whose CRIU part is one file, pstree.img, holding `bytes`; gpu/100 an empty directory.
fs::path make_layout(const fs::path& root, const std::string& bytes = "abc") {
  const fs::path dir = root / "image";
  fs::create_directories(dir / "criu");
  fs::create_directories(dir / "gpu" / "100");
  write(dir / "criu" / "pstree.img", bytes);
  write(dir / "process.json", good_manifest(bytes).dump());
  return dir;
}

std::string layout_error(const fs::path& dir) {
  try {
    const auto p = ckpt::read_process_image(dir);
    ckpt::check_process_layout(dir, p);
    ckpt::verify_criu_files(dir, p);
  } catch (const image_error& e) {
    return e.what();
  }
  return "";
}

// A pstree.img as CRIU writes it: the common and pstree magics, then each entry as a u32 size and a
// protobuf message (pid = 1, ppid = 2, pgid = 3, sid = 4).
std::string pstree(const std::vector<std::pair<std::uint64_t, std::uint64_t>>& entries) {
  auto u32 = [](std::uint32_t v) { return std::string(reinterpret_cast<const char*>(&v), 4); };
  auto varint = [](std::uint64_t v) {
    std::string out;
    do {
      out += static_cast<char>((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
      v >>= 7;
    } while (v != 0);
    return out;
  };
  std::string out = u32(0x54564319) + u32(0x50273030);
  for (const auto& [pid, ppid] : entries) {
    const std::string m = "\x08" + varint(pid) + "\x10" + varint(ppid) + "\x18" + varint(pid) + "\x20" + varint(pid);
    out += u32(static_cast<std::uint32_t>(m.size())) + m;
  }
  return out;
}

}  // namespace

TEST_CASE("process.json: a good one reads; numbers that do not fit are refused, not coerced", "[unit][process]") {
  CHECK(parse_error(good_manifest()).empty());
  auto with = [](const char* key, const nlohmann::json& value) {
    auto j = good_manifest();
    j[key] = value;
    return parse_error(j);
  };
  auto member_with = [](const char* key, const nlohmann::json& value) {
    auto j = good_manifest();
    j["processes"][0][key] = value;
    return parse_error(j);
  };
  auto file_with = [](const char* key, const nlohmann::json& value) {
    auto j = good_manifest();
    j["criu_files"][0][key] = value;
    return parse_error(j);
  };
  CHECK_THAT(with("version", 1.5), Contains("version"));
  CHECK_THAT(with("version", 4), Contains("version 4"));
  CHECK_THAT(with("job", true), Contains("job: not in a version 1 image"));  // version 3 adds whole jobs
  CHECK(parse_error([] {
          auto j = good_manifest();
          j["version"] = 3;
          j["job"] = true;
          return j;
        }())
            .empty());
  CHECK_THAT(with("root_pid", (1ULL << 32) + 100), Contains("root_pid"));
  CHECK_THAT(with("root_pid", -1), Contains("root_pid"));
  CHECK_THAT(with("root_pid", 0), Contains("root_pid"));
  CHECK_THAT(with("root_pid", 4194305), Contains("no pid"));
  CHECK_THAT(with("root_pid", 100.0), Contains("root_pid"));
  CHECK_THAT(with("gpu_bytes", -5), Contains("gpu_bytes"));
  CHECK_THAT(with("gpu_bytes", 1e30), Contains("gpu_bytes"));
  CHECK_THAT(with("stopped_seconds", -1), Contains("stopped_seconds"));
  CHECK_THAT(with("left_running", 1), Contains("left_running"));
  CHECK_THAT(with("processes", nlohmann::json::array()), Contains("processes"));
  CHECK_THAT(member_with("pid", (1ULL << 32) + 100), Contains("processes[0].pid"));
  CHECK_THAT(member_with("parent", -3), Contains("processes[0].parent"));
  CHECK_THAT(member_with("command", "prog"), Contains("processes[0].command"));
  CHECK_THAT(member_with("driver_checkpointed", "yes"), Contains("driver_checkpointed"));
  CHECK_THAT(file_with("bytes", -1), Contains("criu_files[0].bytes"));
  CHECK_THAT(file_with("bytes", 1e30), Contains("criu_files[0].bytes"));
  CHECK_THAT(file_with("name", "../etc/shadow"), Contains("not a plain file name"));
  CHECK_THAT(file_with("checksum", "xyz"), Contains("checksum"));
  // A repeated pid, and text that is no JSON or nested deep.
  auto two = good_manifest();
  two["processes"].push_back(two["processes"][0]);
  CHECK_THAT(parse_error(two), Contains("repeated"));
  CHECK_THROWS_AS(ckpt::parse_process_manifest(std::string(100, '['), "p"), image_error);
  CHECK_THROWS_AS(ckpt::parse_process_manifest("{", "p"), image_error);
  // What a refusal quotes is printable.
  CHECK_THAT(file_with("name", "a\x1b[2J/b"), Contains("\\x1b[2J"));
}

TEST_CASE("process.json version 2: pre-copied parts, named only there; version 1 images still read",
          "[unit][process]") {
  auto pre_copied = [](int version, const nlohmann::json& id) {
    auto j = good_manifest();
    j["version"] = version;
    j["processes"][0]["pre_copy_image_id"] = id;
    return j;
  };
  CHECK(parse_error(pre_copied(2, "pre-id")).empty());
  CHECK(ckpt::parse_process_manifest(pre_copied(2, "pre-id").dump(), "p").processes[0].pre_copy_image_id == "pre-id");
  CHECK(ckpt::parse_process_manifest(good_manifest().dump(), "p").processes[0].pre_copy_image_id.empty());
  CHECK_THAT(parse_error(pre_copied(1, "pre-id")), Contains("not in a version 1 image"));
  CHECK_THAT(parse_error(pre_copied(2, "")), Contains("pre_copy_image_id: empty"));
  CHECK_THAT(parse_error(pre_copied(2, 7)), Contains("processes[0].pre_copy_image_id"));

  // Written as version 2 only when a part is pre-copied: older tools still read every other image.
  temp_dir t;
  ckpt::process_image p = ckpt::parse_process_manifest(good_manifest().dump(), "p");
  ckpt::write_process_manifest(t.path, p);
  CHECK(nlohmann::json::parse(std::ifstream(t.path / "process.json"))["version"] == 1);
  p.processes[0].pre_copy_image_id = "pre-id";
  ckpt::write_process_manifest(t.path, p);
  const auto again = ckpt::read_process_image(t.path);
  CHECK(nlohmann::json::parse(std::ifstream(t.path / "process.json"))["version"] == 2);
  CHECK(again.processes[0].pre_copy_image_id == "pre-id");
  CHECK(again.pre_copied());

  // The layout: gpu/PID.pre exactly where process.json names a pre-copied part.
  const fs::path dir = make_layout(t.path);
  fs::create_directory(dir / "gpu" / "100.pre");
  CHECK_THAT(layout_error(dir), Contains("100.pre: not a GPU part"));
  write(dir / "process.json", pre_copied(2, "pre-id").dump());
  CHECK(layout_error(dir).empty());
  fs::remove(dir / "gpu" / "100.pre");
  CHECK_THAT(layout_error(dir), Contains("100.pre"));
}

TEST_CASE("the whole-process reader refuses links and special files anywhere, and checks sizes before reading",
          "[unit][process]") {
  temp_dir t;
  SECTION("a good layout") { CHECK(layout_error(make_layout(t.path)).empty()); }
  SECTION("process.json a symbolic link") {
    const fs::path dir = make_layout(t.path);
    write(t.path / "elsewhere.json", good_manifest().dump());
    fs::remove(dir / "process.json");
    fs::create_symlink(t.path / "elsewhere.json", dir / "process.json");
    CHECK_THAT(layout_error(dir), Contains("symbolic link"));
    CHECK_FALSE(ckpt::is_process_image(dir));
  }
  SECTION("a CRIU file a link to /etc/shadow: refused, its size never said") {
    const fs::path dir = make_layout(t.path);
    fs::remove(dir / "criu" / "pstree.img");
    fs::create_symlink("/etc/shadow", dir / "criu" / "pstree.img");
    const std::string why = layout_error(dir);
    CHECK_THAT(why, Contains("symbolic link"));
    CHECK_THAT(why, !Contains("bytes"));
  }
  SECTION("a CRIU file a link to /proc/kmsg: refused at once, never read") {
    const fs::path dir = make_layout(t.path);
    fs::remove(dir / "criu" / "pstree.img");
    fs::create_symlink("/proc/kmsg", dir / "criu" / "pstree.img");
    const auto start = std::chrono::steady_clock::now();
    CHECK_THAT(layout_error(dir), Contains("symbolic link"));
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
  }
  SECTION("a link to a good copy elsewhere is refused too") {
    const fs::path dir = make_layout(t.path);
    fs::rename(dir / "criu" / "pstree.img", t.path / "copy.img");
    fs::create_symlink(t.path / "copy.img", dir / "criu" / "pstree.img");
    CHECK_THAT(layout_error(dir), Contains("symbolic link"));
  }
  SECTION("a link to a directory in gpu/") {
    const fs::path dir = make_layout(t.path);
    fs::rename(dir / "gpu" / "100", t.path / "part");
    fs::create_directory_symlink(t.path / "part", dir / "gpu" / "100");
    CHECK_THAT(layout_error(dir), Contains("symbolic link"));
  }
  SECTION("a FIFO: refused without blocking") {
    const fs::path dir = make_layout(t.path);
    fs::remove(dir / "criu" / "pstree.img");
    REQUIRE(::mkfifo((dir / "criu" / "pstree.img").c_str(), 0600) == 0);
    CHECK_THAT(layout_error(dir), Contains("special file"));
  }
  SECTION("a sparse file of a terabyte: refused by its size, not read") {
    const fs::path dir = make_layout(t.path);
    fs::resize_file(dir / "criu" / "pstree.img", 1ULL << 40);
    const auto start = std::chrono::steady_clock::now();
    CHECK_THAT(layout_error(dir), Contains("1099511627776 bytes, process.json says 3"));
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
  }
  SECTION("a process.json of a gigabyte: refused by its size") {
    const fs::path dir = make_layout(t.path);
    fs::resize_file(dir / "process.json", 1ULL << 30);
    CHECK_THAT(layout_error(dir), Contains("more than the"));
  }
  SECTION("a GPU part process.json does not name, and an extra CRIU file") {
    const fs::path dir = make_layout(t.path);
    fs::create_directory(dir / "gpu" / "101");
    CHECK_THAT(layout_error(dir), Contains("not a GPU part"));
    fs::remove(dir / "gpu" / "101");
    write(dir / "criu" / "extra.img", "x");
    CHECK_THAT(layout_error(dir), Contains("not in process.json"));
  }
}

TEST_CASE("CRIU's pstree.img: the pids it restores, its root first; anything else refused", "[unit][process]") {
  const auto tree = ckpt::parse_criu_pstree(pstree({{100, 0}, {101, 100}, {102, 100}}), "pstree.img");
  CHECK(tree.pids == std::vector<pid_t>{100, 101, 102});
  CHECK(tree.parents == std::vector<pid_t>{0, 100, 100});
  CHECK_THROWS_WITH(ckpt::parse_criu_pstree("", "p"), Contains("no pstree magic"));
  CHECK_THROWS_WITH(ckpt::parse_criu_pstree(pstree({}), "p"), Contains("no process"));
  CHECK_THROWS_WITH(ckpt::parse_criu_pstree(pstree({{100, 0}, {100, 100}}), "p"), Contains("twice"));
  CHECK_THROWS_WITH(ckpt::parse_criu_pstree(pstree({{100, 0}, {101, 7}}), "p"), Contains("tree order"));
  CHECK_THROWS_WITH(ckpt::parse_criu_pstree(pstree({{(1ULL << 32) + 100, 0}}), "p"), Contains("beyond"));
  std::string cut = pstree({{100, 0}});
  cut.resize(cut.size() - 2);
  CHECK_THROWS_WITH(ckpt::parse_criu_pstree(cut, "p"), Contains("past"));
}

// A core-PID.img as CRIU writes it: the common and core magics, one core_entry (mtype = 1, then its task core, tc =
// 3, whose task_state = 1 comes first).
std::string core(std::uint8_t task_state) {
  auto u32 = [](std::uint32_t v) { return std::string(reinterpret_cast<const char*>(&v), 4); };
  const std::string tc = std::string("\x08") + static_cast<char>(task_state) + std::string("\x10\x00", 2);
  const std::string entry = std::string("\x08\x01") + "\x1a" + static_cast<char>(tc.size()) + tc;
  return u32(0x54564319) + u32(0x55053847) + u32(static_cast<std::uint32_t>(entry.size())) + entry;
}

TEST_CASE("CRIU's core image: a task recorded stopped by a signal is told apart; anything unreadable is not",
          "[unit][process]") {
  CHECK(ckpt::criu_task_stopped(core(3)));
  CHECK_FALSE(ckpt::criu_task_stopped(core(1)));  // TASK_ALIVE
  CHECK_FALSE(ckpt::criu_task_stopped(core(6)));  // TASK_ZOMBIE
  CHECK_FALSE(ckpt::criu_task_stopped(""));
  CHECK_FALSE(ckpt::criu_task_stopped(core(3).substr(0, 15)));  // cut inside its entry
  std::string other = core(3);
  other[4] = 0;  // not a core image
  CHECK_FALSE(ckpt::criu_task_stopped(other));
}

TEST_CASE("ownership: an image root restores is one nobody but root can have written", "[unit][process]") {
  if (::geteuid() != 0) VMMCKPT_SKIP("changing a file's owner needs root");
  temp_dir t;
  const fs::path dir = make_layout(t.path);
  CHECK(ckpt::distrust_of(dir).empty());
  ::chown((dir / "criu" / "pstree.img").c_str(), 65534, 65534);
  CHECK_THAT(ckpt::distrust_of(dir), Contains("pstree.img is owned by uid 65534"));
  ::chown((dir / "criu" / "pstree.img").c_str(), 0, 0);
  ::chmod((dir / "gpu").c_str(), 0777);
  CHECK_THAT(ckpt::distrust_of(dir), Contains("gpu is writable by every user"));
  ::chmod((dir / "gpu").c_str(), 0700);
  ::chmod((dir / "process.json").c_str(), 0620);
  CHECK_THAT(ckpt::distrust_of(dir), Contains("process.json is writable by its group"));
  ::chmod((dir / "process.json").c_str(), 0600);
  // A directory above that another user may write: they could put another image in its place.
  ::chown(t.path.c_str(), 65534, 65534);
  CHECK_THAT(ckpt::distrust_of(dir), Contains("a directory above the image, is owned by uid 65534"));
  ::chown(t.path.c_str(), 0, 0);
  ::chmod(t.path.c_str(), 0777);
  CHECK_THAT(ckpt::distrust_of(dir), Contains("a directory above the image, is writable by other users"));
  ::chmod(t.path.c_str(), 01777);  // sticky, as /tmp: others cannot rename what is root's
  CHECK(ckpt::distrust_of(dir).empty());
}

TEST_CASE("CRIU run by a user who is not root needs its capabilities, in its file or passed on", "[unit][process]") {
  using vmmckpt::ckpt::criu_capable;
  constexpr std::uint64_t wanted = (std::uint64_t{1} << 40) | (std::uint64_t{1} << 19);
  const fs::path file = fs::temp_directory_path() / ("vmmckpt-caps-" + std::to_string(::getpid()));
  std::ofstream(file) << "#!/bin/sh\n";
  CHECK_FALSE(criu_capable(file.string(), 0, wanted));
  CHECK(criu_capable(file.string(), wanted | 1, wanted));                    // passed on (ambient)
  CHECK_FALSE(criu_capable(file.string(), std::uint64_t{1} << 40, wanted));  // only one of the two
  // vfs_cap_data revision 2: magic with the effective flag, then permitted/inheritable for bits 0-31 and 32-63.
  const auto set_caps = [&](std::uint32_t magic, std::uint32_t low, std::uint32_t high) {
    const std::uint32_t raw[5] = {magic, low, 0, high, 0};
    return ::setxattr(file.c_str(), "security.capability", raw, sizeof raw, 0) == 0;
  };
  if (!set_caps(0x02000001, 1u << 19, 1u << 8)) {
    fs::remove(file);
    VMMCKPT_SKIP("cannot set file capabilities here (needs CAP_SETFCAP)");
  }
  CHECK(criu_capable(file.string(), 0, wanted));
  REQUIRE(set_caps(0x02000000, 1u << 19, 1u << 8));  // permitted, not raised at exec (no effective flag)
  CHECK_FALSE(criu_capable(file.string(), 0, wanted));
  REQUIRE(set_caps(0x02000001, 0, 1u << 8));  // CAP_SYS_PTRACE lacking
  CHECK_FALSE(criu_capable(file.string(), 0, wanted));
  fs::remove(file);
}
