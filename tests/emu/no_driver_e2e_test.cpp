// cuda-ckpt where no CUDA driver can be loaded (storage and login nodes, CI): the commands that touch no GPU work, dump says why it cannot.
#include <catch2/catch.hpp>

#include <cstdio>
#include <string>

#include "e2e_support.hpp"

using namespace vmmckpt::test;

namespace {

const std::string emulated_driver = build_dir + "/lib/emu/libcuda.so.1";

// No driver to be found: VMMCKPT_LIBCUDA names a library that does not exist, and LD_LIBRARY_PATH (which
// the emu tests point at the emulated driver) is unset, so nothing but the tool's own libraries loads.
const std::map<std::string, std::string> no_driver = {{"VMMCKPT_LIBCUDA", "/nonexistent/libcuda.so.1"},
                                                      {"LD_LIBRARY_PATH", ""}};
bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("without a driver, cuda-ckpt reads images and lists processes; dump says it needs the driver",
          "[emu][no_driver]") {
  scratch_dir scratch;
  const fs::path image = scratch.path / "image";
  auto writer = start_writer();
  const std::string pid = std::to_string(writer->pid());

  // The image made with the driver named by VMMCKPT_LIBCUDA alone (the emulated one), LD_LIBRARY_PATH unset.
  const auto dumped = run_process({cuda_ckpt, "dump", pid, "-o", image.string()},
                                  {{"VMMCKPT_LIBCUDA", emulated_driver}, {"LD_LIBRARY_PATH", ""}}, 120);
  INFO(describe(dumped));
  REQUIRE(dumped.exit_code == 0);
  require_untorn(image);

  SECTION("help, version, inspect, verify, cat, ps and gc run") {
    const auto help = run_process({cuda_ckpt, "--help"}, no_driver);
    INFO(describe(help));
    REQUIRE(help.exit_code == 0);
    REQUIRE(contains(help.out, "VMMCKPT_LIBCUDA"));
    const auto version = run_process({cuda_ckpt, "--version"}, no_driver);
    REQUIRE(version.exit_code == 0);
    REQUIRE(version.out.rfind("cuda-ckpt ", 0) == 0);

    const auto inspected = run_process({cuda_ckpt, "inspect", "--json", image.string()}, no_driver);
    INFO(describe(inspected));
    REQUIRE(inspected.exit_code == 0);
    REQUIRE(nlohmann::json::parse(inspected.out).at("pid").get<pid_t>() == writer->pid());
    const auto verified = run_process({cuda_ckpt, "verify", image.string()}, no_driver);
    INFO(describe(verified));
    REQUIRE(verified.exit_code == 0);

    std::uint64_t buffer = 0;  // one of the writer's buffers
    for (const auto& a : vmmckpt::image::reader::open(image).info().pools.at(0).allocations)
      if (a.size == writer_buffer_size) buffer = a.addr;
    REQUIRE(buffer != 0);
    const fs::path bytes = scratch.path / "bytes";
    const auto cat =
        run_process({cuda_ckpt, "cat", image.string(), hex(buffer), "4096", "-o", bytes.string()}, no_driver);
    INFO(describe(cat));
    REQUIRE(cat.exit_code == 0);
    REQUIRE(fs::file_size(bytes) == 4096);

    const auto ps = run_process({cuda_ckpt, "ps", "--json"}, no_driver);
    INFO(describe(ps));
    REQUIRE(ps.exit_code == 0);
    bool listed = false;
    for (const auto& p : nlohmann::json::parse(ps.out)) listed = listed || p.at("pid").get<pid_t>() == writer->pid();
    REQUIRE(listed);

    const fs::path empty = scratch.path / "gc";
    fs::create_directory(empty);
    const auto gc = run_process({cuda_ckpt, "gc", "--dry-run", empty.string()}, no_driver);
    INFO(describe(gc));
    REQUIRE(gc.exit_code == 0);
  }

  SECTION("dump and suspend fail with exit status 1, naming the library, and leave the program running") {
    for (const std::string command : {"dump", "suspend"}) {
      const fs::path out = scratch.path / ("no-driver-" + command);
      const auto r = run_process({cuda_ckpt, command, pid, "-o", out.string()}, no_driver);
      INFO(describe(r));
      REQUIRE(r.exit_code == 1);
      REQUIRE(r.signal == 0);
      REQUIRE(
          contains(r.err, "cuda-ckpt " + command + ": the CUDA driver (/nonexistent/libcuda.so.1) cannot be loaded"));
      REQUIRE(contains(r.err, command + " needs it; inspect, verify, cat, ps and gc do not"));
      REQUIRE_FALSE(fs::exists(out));
    }
    // Refused before the program was touched: it still runs, and a dump with the driver still works.
    REQUIRE(writer->running());
    REQUIRE(listed_state(writer->pid()).at("state") == "running");
    const fs::path again = scratch.path / "again";
    const auto r = run_process({cuda_ckpt, "dump", pid, "-o", again.string()}, {}, 120);
    INFO(describe(r));
    REQUIRE(r.exit_code == 0);
    require_untorn(again);
  }

  SECTION("a library that is not the driver is named with what it lacks") {
    const fs::path out = scratch.path / "not-a-driver";
    const auto r = run_process({cuda_ckpt, "dump", pid, "-o", out.string()},
                               {{"VMMCKPT_LIBCUDA", "libm.so.6"}, {"LD_LIBRARY_PATH", ""}});
    INFO(describe(r));
    REQUIRE(r.exit_code == 1);
    REQUIRE(contains(r.err, "the CUDA driver (libm.so.6) lacks cuInit"));
    REQUIRE_FALSE(fs::exists(out));
    REQUIRE(writer->running());
  }
}
