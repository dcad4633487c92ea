// End-to-end tests of legacy CUDA IPC on pool memory: an exporter and an importer under the shim, every
// answer the driver gives, dumps and suspends of both sides (docs/ipc.md). Run on a GPU too (gpu.ipc).
#include <catch2/catch.hpp>

#include <signal.h>

#include <nlohmann/json.hpp>
#include <fstream>
#include <memory>
#include <string>

#include "e2e_support.hpp"

using namespace vmmckpt::test;

namespace {

const std::string program = programs + "emu_ipc_pair";

std::unique_ptr<background_process> start(const char* mode, const fs::path& dir, const std::string& until) {
  auto p = std::make_unique<background_process>(
      std::vector<std::string>{cuda_ckpt, "run", "--", program, mode, dir.string()});
  if (!p->wait_for_output(until)) FAIL(mode << " never said " << until << "; it said:\n" << p->output());
  return p;
}

bool says(const background_process& p, const std::string& line) {
  return p.output().find(line + "\n") != std::string::npos;
}

}  // namespace

TEST_CASE("ipc: pool memory shared between two processes, with the driver's answers to every misuse; dumps and "
          "suspends of both",
          "[emu][ipc]") {
  scratch_dir dir;
  auto exporter = start("export", dir.path, "ready\n");
  INFO("exporter:\n" << exporter->output());
  // The driver's answers, measured on an H100: one handle per allocation, whatever address in it; host
  // memory and no handle pointer are invalid values; a process cannot open its own handle.
  CHECK(says(*exporter, "interior handle equals base handle: 1"));
  CHECK(says(*exporter, "get_host: 1"));
  CHECK(says(*exporter, "get_null_handle: 1"));
  CHECK(says(*exporter, "open_own: 201"));

  // The importer wrote its word, closed every reference and opened the handle again: the memory is the same.
  auto importer = start("import", dir.path, "holding 600dcafe\n");
  INFO("importer:\n" << importer->output());
  CHECK(says(*importer, "interior handle opens at the base: 1"));
  CHECK(says(*importer, "second open, same pointer: 1"));
  CHECK(says(*importer, "last word: abcd1234"));
  CHECK(says(*importer, "small block: 11111111"));
  CHECK(says(*importer, "open_freed: 1"));
  CHECK(says(*importer, "open_junk: 1"));
  CHECK(says(*importer, "open_flags_0: 1"));
  CHECK(says(*importer, "open_null_out: 1"));
  CHECK(says(*importer, "close_interior: 1"));
  CHECK(says(*importer, "close_1: 0"));
  CHECK(says(*importer, "close_2: 0"));
  CHECK(says(*importer, "close_3: 1"));
  CHECK(says(*importer, "close_not_imported: 1"));
  CHECK(says(*importer, "four threads, one pointer: 1"));
  CHECK(says(*importer, "four closes: 4, a fifth: 1"));

  SECTION("both map the same bytes: the importer's write is the exporter's") {
    ::kill(exporter->pid(), SIGUSR1);
    REQUIRE(exporter->wait_for_output("a0 600dcafe\n"));
  }

  SECTION("suspending the exporter is refused while the importer maps its memory, and works once it closed") {
    const auto pid = std::to_string(exporter->pid());
    const auto refused = run_process({cuda_ckpt, "suspend", pid, "-o", (dir.path / "s1").string()});
    INFO(describe(refused));
    CHECK(refused.exit_code != 0);
    CHECK_THAT(refused.err, Catch::Matchers::Contains("CUDA IPC") &&
                                Catch::Matchers::Contains("pid " + std::to_string(importer->pid())));
    CHECK_FALSE(fs::exists(dir.path / "s1"));
    // A dump of either side is no suspend: both work, and the importer's image records what it maps.
    const auto exporter_dump = run_process({cuda_ckpt, "dump", pid, "-o", (dir.path / "e").string()});
    CHECK(exporter_dump.exit_code == 0);
    const auto importer_dump =
        run_process({cuda_ckpt, "dump", std::to_string(importer->pid()), "-o", (dir.path / "i").string()});
    INFO(describe(importer_dump));
    REQUIRE(importer_dump.exit_code == 0);
    std::ifstream in(dir.path / "i" / "manifest.json");
    const auto manifest = nlohmann::json::parse(in);
    REQUIRE(manifest["ipc_imports"].size() == 1);
    CHECK(manifest["ipc_imports"][0]["exporter_pid"] == exporter->pid());
    CHECK(manifest["ipc_imports"][0]["size"] == 8 << 20);
    const auto inspected = run_process({cuda_ckpt, "inspect", (dir.path / "i").string()});
    CHECK_THAT(inspected.out, Catch::Matchers::Contains("imported  8.00 MiB of process " + pid));
    // The importer's suspend leaves what it maps mapped: after resume it closes its handle as before.
    const auto importer_pid = std::to_string(importer->pid());
    const auto importer_suspend = run_process({cuda_ckpt, "suspend", importer_pid, "-o", (dir.path / "si").string()});
    INFO(describe(importer_suspend));
    REQUIRE(importer_suspend.exit_code == 0);
    REQUIRE(run_process({cuda_ckpt, "resume", importer_pid}).exit_code == 0);
    ::kill(importer->pid(), SIGUSR1);
    REQUIRE(importer->wait_for_output("closed\n"));
    const auto suspended = run_process({cuda_ckpt, "suspend", pid, "-o", (dir.path / "s2").string()});
    INFO(describe(suspended));
    REQUIRE(suspended.exit_code == 0);
    REQUIRE(run_process({cuda_ckpt, "resume", pid}).exit_code == 0);
    ::kill(exporter->pid(), SIGUSR1);
    CHECK(exporter->wait_for_output("a0 600dcafe\n"));  // the importer's write survived the suspend
  }

  SECTION("an exporter that exited: its handles are invalid") {
    ::kill(importer->pid(), SIGTERM);
    importer->wait();
    ::kill(exporter->pid(), SIGTERM);
    exporter->wait();
    const auto r = run_process({cuda_ckpt, "run", "--", program, "open", dir.path.string()});
    INFO(describe(r));
    CHECK(r.exit_code == 0);
    CHECK_THAT(r.out, Catch::Matchers::Contains("open: 400"));
  }
}
