// End-to-end tests of the memory an NCCL rank maps itself (tests/programs/emu/nccl_rank.cpp): small reservations
// carved out of the VMM window, memory pools, host-located VMM memory and buffers imported from another rank, in
// dumps, suspends, restores and `ps`, with no --allow-partial.
#include <catch2/catch.hpp>

#include <fstream>

#include "e2e_support.hpp"

using namespace vmmckpt::test;

namespace {

const std::string rank_program = programs + "emu_nccl_rank";

void ask(background_process& p, const fs::path& dir, int rank, const std::string& what, const std::string& answer) {
  std::ofstream(dir / std::to_string(rank) / what).put('\n');
  INFO(p.output());
  REQUIRE(p.wait_for_output(answer));
}

nlohmann::json inspect(const fs::path& image) {
  const auto r = run_process({cuda_ckpt, "inspect", image.string(), "--json"});
  INFO(describe(r));
  REQUIRE(r.exit_code == 0);
  return nlohmann::json::parse(r.out);
}

process_result dump(pid_t pid, const fs::path& image) {
  return run_process({cuda_ckpt, "dump", std::to_string(pid), "-o", image.string()});
}

pid_t pid_of_rank(const background_process& p, int rank) {
  const std::string marker = "pid " + std::to_string(rank) + " ";
  const auto at = p.output().find(marker);
  REQUIRE(at != std::string::npos);
  return static_cast<pid_t>(std::stol(p.output().substr(at + marker.size())));
}

// The image's allocations of the pools of kind "pool" made through `api`.
std::size_t allocations_through(const nlohmann::json& inspected, const std::string& api) {
  std::size_t n = 0;
  for (const auto& pool : inspected.at("pools"))
    for (const auto& a : pool.at("allocations"))
      if (a.at("api") == api) ++n;
  return n;
}

}  // namespace

TEST_CASE("a rank that maps all of its memory itself is reachable, dumped whole, and restored in a new process",
          "[emu][nccl_rank]") {
  scratch_dir dir;
  background_process rank({cuda_ckpt, "run", "--", rank_program, dir.path.string()});
  REQUIRE(rank.wait_for_output("ready 0\n"));
  const fs::path image = dir.path / "image";
  // No cudaMalloc ever, and nothing passes through.
  const auto dumped = dump(rank.pid(), image);
  INFO(describe(dumped));
  REQUIRE(dumped.exit_code == 0);
  ask(rank, dir.path, 0, "check", "ok 0 1\n");

  const auto inspected = inspect(image);
  CHECK_FALSE(inspected.contains("lacking"));
  const auto& vmm = inspected.at("vmm");
  CHECK(vmm.at("reservations").size() == 3);  // the first 2 MiB, the buffer's, the host memory's
  CHECK(vmm.at("handles").size() == 2);
  CHECK(allocations_through(inspected, "cuMemAllocFromPoolAsync") == 1);  // the freed one is gone
  // The host memory's handle keeps its location, and its access rights the host's.
  bool host_rights = false;
  for (const auto& a : vmm.at("access"))
    for (const auto& r : a.at("rights"))
      if (r.at("type") == 3) host_rights = true;  // CU_MEM_LOCATION_TYPE_HOST_NUMA
  CHECK(host_rights);
  const auto verified = run_process({cuda_ckpt, "verify", image.string()});
  INFO(describe(verified));
  CHECK(verified.exit_code == 0);

  ask(rank, dir.path, 0, "finish", "done 0\n");
  REQUIRE(rank.wait() == 0);
  background_process restored(
      {cuda_ckpt, "restore", image.string(), "--", rank_program, dir.path.string(), "--restored"});
  REQUIRE(restored.wait_for_output("restored 0"));
  ask(restored, dir.path, 0, "check", "ok 0 1\n");
  ask(restored, dir.path, 0, "finish", "done 0\n");
  CHECK(restored.wait() == 0);

  background_process replayed(
      {cuda_ckpt, "restore", image.string(), "--replay", "--", rank_program, dir.path.string(), "--replayed"});
  INFO(replayed.output());
  REQUIRE(replayed.wait_for_output("replayed 0"));
  ask(replayed, dir.path, 0, "finish", "done 0\n");
  CHECK(replayed.wait() == 0);
}

TEST_CASE("a program that maps every byte with the VMM API is reachable from its first VMM call and dumped whole",
          "[emu][nccl_rank]") {
  scratch_dir dir;
  background_process rank({cuda_ckpt, "run", "--", rank_program, dir.path.string(), "--vmm-only"});
  REQUIRE(rank.wait_for_output("ready 0\n"));
  const auto dumped = dump(rank.pid(), dir.path / "image");
  INFO(describe(dumped));
  REQUIRE(dumped.exit_code == 0);
  CHECK(allocations_through(inspect(dir.path / "image"), "cuMemAllocFromPoolAsync") == 0);
  ask(rank, dir.path, 0, "check", "ok 0 1\n");
  ask(rank, dir.path, 0, "finish", "done 0\n");
  CHECK(rank.wait() == 0);
}

TEST_CASE("a suspend frees a rank's pool and device memory, keeps its host memory, and resume gives it all back",
          "[emu][nccl_rank]") {
  scratch_dir dir;
  background_process rank({cuda_ckpt, "run", "--", rank_program, dir.path.string()});
  REQUIRE(rank.wait_for_output("ready 0\n"));
  const auto suspended = run_process({cuda_ckpt, "suspend", std::to_string(rank.pid()), "--json"});
  INFO(describe(suspended));
  REQUIRE(suspended.exit_code == 0);
  // The device buffer (2 MiB) and the pool's memory are given back; the host memory stays (it is no GPU memory).
  CHECK(nlohmann::json::parse(suspended.out).at("freed_bytes").get<std::uint64_t>() >= 2u << 20);
  const auto resumed = run_process({cuda_ckpt, "resume", std::to_string(rank.pid())});
  INFO(describe(resumed));
  REQUIRE(resumed.exit_code == 0);
  ask(rank, dir.path, 0, "check", "ok 0 1\n");
  ask(rank, dir.path, 0, "finish", "done 0\n");
  CHECK(rank.wait() == 0);
}

TEST_CASE("ranks that map each other's buffers: each dump records the other's as an import, a suspend is refused "
          "naming the importer, and a restored rank maps its peer's memory again",
          "[emu][nccl_rank]") {
  scratch_dir dir;
  background_process job({cuda_ckpt, "run", "--", rank_program, dir.path.string(), "--peer"});
  REQUIRE(job.wait_for_output("ready 0\n"));
  REQUIRE(job.wait_for_output("ready 1\n"));
  const pid_t rank0 = pid_of_rank(job, 0), rank1 = pid_of_rank(job, 1);

  for (const auto& [pid, other] : {std::pair{rank0, rank1}, std::pair{rank1, rank0}}) {
    const fs::path image = dir.path / ("image-" + std::to_string(pid));
    const auto dumped = dump(pid, image);
    INFO(describe(dumped));
    REQUIRE(dumped.exit_code == 0);  // no --allow-partial: the imports are recorded, not lacking
    const auto inspected = inspect(image);
    const auto& imports = inspected.at("vmm").at("imports");
    REQUIRE(imports.size() == 2);  // the peer's device buffer and host memory
    for (const auto& x : imports) CHECK(x.at("exporter_pid") == other);
    const auto verified = run_process({cuda_ckpt, "verify", image.string()});
    INFO(describe(verified));
    CHECK(verified.exit_code == 0);
  }
  ask(job, dir.path, 0, "check", "ok 0 1\n");
  ask(job, dir.path, 1, "check", "ok 1 1\n");

  // Each maps the other's memory: a suspend of either would take it from under the other.
  const auto refused = run_process({cuda_ckpt, "suspend", std::to_string(rank0), "-o", (dir.path / "s").string()});
  INFO(describe(refused));
  CHECK(refused.exit_code != 0);
  CHECK(refused.err.find("pid " + std::to_string(rank1)) != std::string::npos);
  CHECK_FALSE(fs::exists(dir.path / "s"));
  ask(job, dir.path, 0, "check", "ok 0 2\n");

  // ps names NCCL's share only for NCCL's own calls: none here.
  const auto listed = listed_state(rank1);
  CHECK(listed.value("nccl_bytes", 0) == 0);

  // Rank 1 ends; a new process restored from its image maps rank 0's memory again and finds its bytes.
  ask(job, dir.path, 1, "finish", "done 1\n");
  background_process restored({cuda_ckpt, "restore", (dir.path / ("image-" + std::to_string(rank1))).string(), "--",
                               rank_program, dir.path.string(), "--restored", "1"});
  INFO(restored.output());
  REQUIRE(restored.wait_for_output("restored 1"));
  ask(restored, dir.path, 1, "check", "ok 1 1\n");
  ask(restored, dir.path, 1, "finish", "done 1\n");
  CHECK(restored.wait() == 0);
  ask(job, dir.path, 0, "finish", "done 0\n");
  CHECK(job.wait() == 0);
}

TEST_CASE("a first reservation hinted at the window's start gets it, through dump, suspend and restore; a window the "
          "program took itself is refused with VMMCKPT_VMM_BASE named, and works elsewhere",
          "[emu][nccl_rank]") {
  scratch_dir dir;
  {
    background_process rank({cuda_ckpt, "run", "--", rank_program, dir.path.string(), "--window-start"});
    REQUIRE(rank.wait_for_output("ready 0\n"));
    CHECK(rank.output().find("first reservation at 0x300000000000") != std::string::npos);
    const auto dumped = dump(rank.pid(), dir.path / "image");
    INFO(describe(dumped));
    CHECK(dumped.exit_code == 0);
    CHECK_FALSE(listed_state(rank.pid()).at("devices").empty());  // ps names its device
    const auto suspended = run_process({cuda_ckpt, "suspend", std::to_string(rank.pid())});
    const auto resumed = run_process({cuda_ckpt, "resume", std::to_string(rank.pid())});
    INFO(describe(suspended) << describe(resumed));
    CHECK(suspended.exit_code == 0);
    CHECK(resumed.exit_code == 0);
    ask(rank, dir.path, 0, "check", "ok 0 1\n");
    ask(rank, dir.path, 0, "finish", "done 0\n");
    CHECK(rank.wait() == 0);
  }
  {
    background_process restored(
        {cuda_ckpt, "restore", (dir.path / "image").string(), "--", rank_program, dir.path.string(), "--restored"});
    INFO(restored.output());
    REQUIRE(restored.wait_for_output("restored 0"));
    ask(restored, dir.path, 0, "finish", "done 0\n");
    CHECK(restored.wait() == 0);
  }
  const auto taken = run_process({cuda_ckpt, "run", "--", rank_program, dir.path.string(), "--window-taken"});
  INFO(describe(taken));
  CHECK(taken.exit_code == 3);
  CHECK(taken.out.find("reserve failed 2") != std::string::npos);  // CUDA_ERROR_OUT_OF_MEMORY
  CHECK(taken.err.find("VMMCKPT_VMM_BASE") != std::string::npos);
  background_process moved({cuda_ckpt, "run", "--", rank_program, dir.path.string(), "--window-taken"},
                           {{"VMMCKPT_VMM_BASE", "0x580000000000"}});
  INFO(moved.output());
  REQUIRE(moved.wait_for_output("ready 0\n"));
  ask(moved, dir.path, 0, "finish", "done 0\n");
  CHECK(moved.wait() == 0);
}
