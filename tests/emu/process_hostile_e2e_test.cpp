// Whole-process images as hostile input and clumsy handling (issue 32): links and special files in the image,
// numbers that do not fit, an image another user owns, `gc` inside an image, a damaged parent, a missing image.
// The reader must refuse, quickly and saying why, and never change the image or start anything.
#include <sys/stat.h>

#include "process_support.hpp"

namespace vmmckpt::test {
namespace {

// One whole-process image of an ended ticker, copied for each hostile variant (dumping costs seconds).
struct dumped_image {
  ticker_tree t;
  fs::path image = t.dir.path / "image";
  dumped_image() {
    REQUIRE(tool({"dump", std::to_string(t.pid), "--process", "-o", image.string()}).exit_code == 0);
    REQUIRE(wait_gone(t.pid));
  }
  fs::path copy(const std::string& name) const {
    const fs::path to = t.dir.path / name;
    fs::copy(image, to, fs::copy_options::recursive);
    return to;
  }
  // The CRIU file that pstree.img is not (the biggest: a pages image).
  static fs::path biggest_criu_file(const fs::path& image) {
    fs::path biggest;
    for (const auto& entry : fs::directory_iterator(image / "criu"))
      if (biggest.empty() || entry.file_size() > fs::file_size(biggest)) biggest = entry.path();
    return biggest;
  }
};

// The tool on a hostile image, bounded: one that reads /proc/kmsg would block for good.
process_result bounded(const std::vector<std::string>& args) {
  std::vector<std::string> argv{cuda_ckpt};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_process(argv, {}, 20);
}

}  // namespace

TEST_CASE("a whole-process image with a link or special file in it is refused at once by verify, inspect, restore and "
          "rm, and nothing starts",
          "[process][hostile]") {
  REQUIRE_CRIU();
  dumped_image d;
  const std::string shadow_size = std::to_string(fs::file_size("/etc/shadow"));
  struct variant {
    const char* what;
    std::function<void(const fs::path&)> make;
  };
  const std::vector<variant> variants{
      {"a CRIU file a link to /proc/kmsg",
       [](const fs::path& i) {
         const fs::path f = dumped_image::biggest_criu_file(i);
         fs::remove(f);
         fs::create_symlink("/proc/kmsg", f);
       }},
      {"a CRIU file a link to /etc/shadow",
       [](const fs::path& i) {
         const fs::path f = dumped_image::biggest_criu_file(i);
         fs::remove(f);
         fs::create_symlink("/etc/shadow", f);
       }},
      {"a CRIU file a link to a good copy elsewhere",
       [](const fs::path& i) {
         const fs::path f = dumped_image::biggest_criu_file(i);
         fs::rename(f, i.parent_path() / (i.filename().string() + "-copy.img"));
         fs::create_symlink(i.parent_path() / (i.filename().string() + "-copy.img"), f);
       }},
      {"process.json a link to /proc/kmsg",
       [](const fs::path& i) {
         fs::remove(i / "process.json");
         fs::create_symlink("/proc/kmsg", i / "process.json");
       }},
      {"a FIFO among the CRIU files",
       [](const fs::path& i) { REQUIRE(::mkfifo((i / "criu" / "zz.img").c_str(), 0600) == 0); }},
      {"a CRIU file grown to a sparse terabyte",
       [](const fs::path& i) { fs::resize_file(dumped_image::biggest_criu_file(i), 1ULL << 40); }},
  };
  int k = 0;
  for (const auto& v : variants) {
    INFO(v.what);
    const fs::path image = d.copy("hostile-" + std::to_string(k++));
    v.make(image);
    for (const std::vector<std::string>& args :
         {std::vector<std::string>{"verify", image.string()}, std::vector<std::string>{"inspect", image.string()},
          std::vector<std::string>{"restore", image.string()}}) {
      INFO(args[0]);
      const auto r = bounded(args);
      INFO(describe(r));
      CHECK(r.signal == 0);  // not killed at the time limit: it did not block
      CHECK(r.exit_code != 0);
      CHECK((r.out + r.err).find(shadow_size + " bytes") == std::string::npos);
    }
    CHECK(::kill(d.t.pid, 0) != 0);
    // rm either removes it (it is a directory of links, not followed) or refuses; it never blocks.
    const auto rm = bounded({"rm", image.string()});
    CHECK(rm.signal == 0);
  }
  CHECK(fs::exists("/etc/shadow"));
}

TEST_CASE("numbers in process.json that do not fit are refused, not coerced", "[process][hostile]") {
  REQUIRE_CRIU();
  dumped_image d;
  struct variant {
    const char* field;
    std::function<void(nlohmann::json&)> edit;
  };
  const pid_t pid = d.t.pid;
  const std::vector<variant> variants{
      {"root_pid", [&](nlohmann::json& j) { j["root_pid"] = (1ULL << 32) + static_cast<std::uint64_t>(pid); }},
      {"processes[0].pid",
       [&](nlohmann::json& j) { j["processes"][0]["pid"] = (1ULL << 32) + static_cast<std::uint64_t>(pid); }},
      {"criu_files[0].bytes", [](nlohmann::json& j) { j["criu_files"][0]["bytes"] = -1; }},
      {"gpu_bytes", [](nlohmann::json& j) { j["gpu_bytes"] = 1e30; }},
      {"version", [](nlohmann::json& j) { j["version"] = 1.5; }},
  };
  int k = 0;
  for (const auto& v : variants) {
    INFO(v.field);
    const fs::path image = d.copy("numbers-" + std::to_string(k++));
    auto j = nlohmann::json::parse(std::ifstream(image / "process.json"));
    v.edit(j);
    std::ofstream(image / "process.json") << j.dump(2);
    for (const char* command : {"verify", "restore"}) {
      const auto r = bounded({command, image.string()});
      INFO(describe(r));
      CHECK(r.exit_code == 1);
      CHECK((r.out + r.err).find(v.field) != std::string::npos);
    }
    CHECK(::kill(pid, 0) != 0);
  }
}

TEST_CASE("as root, an image another user owns or may write is refused, saying why, unless --trust-owner",
          "[process][hostile]") {
  REQUIRE_CRIU();
  dumped_image d;
  const fs::path file = dumped_image::biggest_criu_file(d.image);
  SECTION("a file owned by another user, its checksums fixed up") {
    REQUIRE(::chown(file.c_str(), 65534, 65534) == 0);
    const auto r = tool({"restore", d.image.string()});
    INFO(describe(r));
    CHECK(r.exit_code == 1);
    CHECK(r.err.find(file.string() + " is owned by uid 65534") != std::string::npos);
    CHECK(r.err.find("--trust-owner") != std::string::npos);
    CHECK(::kill(d.t.pid, 0) != 0);
    // verify and inspect read it: they run nothing.
    CHECK(tool({"verify", d.image.string()}).exit_code == 0);
    const auto trusted = tool({"restore", d.image.string(), "--trust-owner"});
    INFO(describe(trusted));
    CHECK(trusted.exit_code == 0);
    REQUIRE(d.t.goes_on({d.t.log}));
    d.t.stop({d.t.log});
  }
  SECTION("a directory writable by every user") {
    ::chmod((d.image / "gpu").c_str(), 0777);
    const auto r = tool({"restore", d.image.string()});
    CHECK(r.exit_code == 1);
    CHECK(r.err.find("gpu is writable by every user") != std::string::npos);
  }
  SECTION("a directory above it another user owns") {
    const fs::path theirs = d.t.dir.path / "theirs";
    fs::create_directory(theirs);
    fs::rename(d.image, theirs / "image");
    REQUIRE(::chown(theirs.c_str(), 65534, 65534) == 0);
    const auto r = tool({"restore", (theirs / "image").string()});
    CHECK(r.exit_code == 1);
    CHECK(r.err.find("a directory above the image, is owned by uid 65534") != std::string::npos);
  }
}

TEST_CASE("gc never removes part of a whole-process image, and the image and its child still verify",
          "[process][hostile][leftovers]") {
  REQUIRE_CRIU();
  ticker_tree t;
  const fs::path full = t.dir.path / "full", inc = t.dir.path / "inc";
  REQUIRE(tool({"dump", std::to_string(t.pid), "--process", "--leave-running", "-o", full.string()}).exit_code == 0);
  REQUIRE(tool({"dump", std::to_string(t.pid), "--process", "--leave-running", "--parent", full.string(), "-o",
                inc.string()})
              .exit_code == 0);
  for (const auto& dir : {full / "gpu", inc / "gpu", full}) {
    const auto gc = tool({"gc", dir.string(), "--json"});
    INFO(describe(gc));
    CHECK(gc.exit_code == 0);
    for (const auto& removed : nlohmann::json::parse(gc.out)["removed"])
      CHECK(removed["path"].get<std::string>().rfind(t.dir.path.string(), 0) != 0);
  }
  CHECK(fs::exists(full / "gpu" / std::to_string(t.pid) / "manifest.json"));
  CHECK(tool({"verify", full.string()}).exit_code == 0);
  CHECK(tool({"verify", inc.string()}).exit_code == 0);
  REQUIRE(t.goes_on({t.log}));
}

TEST_CASE("dump --process --parent refuses a parent whose CPU part is damaged; restore of a missing image says so",
          "[process][hostile]") {
  REQUIRE_CRIU();
  ticker_tree t;
  const fs::path full = t.dir.path / "full";
  REQUIRE(tool({"dump", std::to_string(t.pid), "--process", "--leave-running", "-o", full.string()}).exit_code == 0);
  const fs::path f = dumped_image::biggest_criu_file(full);
  flip_byte(f, fs::file_size(f) / 2);
  const auto r = tool({"dump", std::to_string(t.pid), "--process", "--leave-running", "--parent", full.string(), "-o",
                       (t.dir.path / "inc").string()});
  INFO(describe(r));
  CHECK(r.exit_code == 1);
  CHECK(r.err.find(f.filename().string()) != std::string::npos);
  CHECK(r.err.find("the CPU part is damaged") != std::string::npos);
  CHECK(nothing_named(t.dir.path / "inc"));
  REQUIRE(t.goes_on({t.log}));

  const auto missing = tool({"restore", (t.dir.path / "nothing").string()});
  CHECK(missing.exit_code == 1);
  CHECK(missing.err.find("nothing does not exist") != std::string::npos);
  CHECK(missing.err.find("GPU memory only") == std::string::npos);
}

}  // namespace vmmckpt::test
