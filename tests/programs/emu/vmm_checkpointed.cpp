// Emulator test program: program-made VMM memory that is dumped, suspended and restored while it lives.
//
//   emu_vmm_checkpointed DIR             builds its memory, writes DIR/state, prints "ready", then serves
//   emu_vmm_checkpointed DIR --restored  started by `cuda-ckpt restore`: its memory is in place; checks it
//                                        against DIR/state, prints "restored", then serves
//   emu_vmm_checkpointed DIR --replayed  started by `cuda-ckpt restore --replay`: makes its memory again
//                                        with the same calls but writes nothing; checks that the addresses,
//                                        tokens and bytes are DIR/state's, prints "replayed", then serves
//
// The memory: one reservation filled as PyTorch's expandable segments fill it (8 MiB handles mapped one
// by one, access given over all of them in one call, a hole unmapped and refilled, then a 16 MiB handle),
// a second reservation left unmapped as vLLM's sleep mode leaves one, a handle retained on an
// interior address as NCCL does, and a block of the pool. Serving: DIR/check checks every byte, that a
// retain anywhere in a mapping gives its token back, and the program's own properties, printing "ok N" or
// "bad ..."; DIR/mutate writes new patterns ("mutated N"); DIR/orphan creates a handle it maps nowhere
// ("orphaned"), whose bytes no dump can read; DIR/finish wakes the sleeping reservation,
// then unmaps, releases and frees everything, every reference included, and prints "done".
#include <cuda.h>

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "vmm_support.hpp"

using namespace vmmckpt::programs;
using vmmckpt::contracts::print_ptr;

namespace {

constexpr size_t mib = 1u << 20;

struct mapping {
  unsigned long long va = 0, size = 0, handle = 0;
  unsigned seed = 0;
};
struct state {
  unsigned long long active = 0, active_size = 0;  // the expandable segment's reservation
  unsigned long long asleep = 0, asleep_size = 0;  // reserved, never mapped
  std::vector<mapping> mappings;
  std::vector<unsigned long long> handles;       // each created handle once (one reference each)
  unsigned long long retained = 0;               // a second reference, taken by a retain
  unsigned long long block = 0, block_size = 0;  // a pool block
  unsigned block_seed = 0;
};

void save(const std::filesystem::path& file, const state& s) {
  std::ofstream out(file);
  out << s.active << ' ' << s.active_size << ' ' << s.asleep << ' ' << s.asleep_size << ' ' << s.retained << ' '
      << s.block << ' ' << s.block_size << ' ' << s.block_seed << '\n'
      << s.handles.size();
  for (auto h : s.handles) out << ' ' << h;
  out << '\n' << s.mappings.size() << '\n';
  for (const auto& m : s.mappings) out << m.va << ' ' << m.size << ' ' << m.handle << ' ' << m.seed << '\n';
}

state load(const std::filesystem::path& file) {
  std::ifstream in(file);
  state s;
  size_t n = 0;
  in >> s.active >> s.active_size >> s.asleep >> s.asleep_size >> s.retained >> s.block >> s.block_size >>
      s.block_seed >> n;
  s.handles.resize(n);
  for (auto& h : s.handles) in >> h;
  in >> n;
  s.mappings.resize(n);
  for (auto& m : s.mappings) in >> m.va >> m.size >> m.handle >> m.seed;
  VMMCKPT_EXPECT(in.good());
  return s;
}

unsigned long long create(size_t bytes, unsigned handle_types) {
  const CUmemAllocationProp prop = device_prop(0, handle_types);
  CUmemGenericAllocationHandle h = 0;
  VMMCKPT_CHECK(cuMemCreate(&h, bytes, &prop, 0));
  print_token(h, "cuMemCreate");
  return h;
}

state build(bool write) {
  state s;
  s.active_size = 64 * mib;
  CUdeviceptr va = 0;
  VMMCKPT_CHECK(cuMemAddressReserve(&va, s.active_size, 0, 0, 0));
  s.active = va;
  print_ptr(s.active, s.active_size, "cuMemAddressReserve");
  for (int i = 0; i < 4; ++i) {
    const unsigned long long h = create(8 * mib, CU_MEM_HANDLE_TYPE_NONE);
    s.handles.push_back(h);
    VMMCKPT_CHECK(cuMemMap(s.active + i * 8 * mib, 8 * mib, 0, h, 0));
    s.mappings.push_back({s.active + i * 8 * mib, 8 * mib, h, 100u + static_cast<unsigned>(i)});
  }
  const CUmemAccessDesc rw = read_write(0);
  VMMCKPT_CHECK(cuMemSetAccess(s.active, 32 * mib, &rw, 1));  // over four mappings at once
  // A hole, refilled with another handle.
  VMMCKPT_CHECK(cuMemUnmap(s.mappings[1].va, 8 * mib));
  VMMCKPT_CHECK(cuMemRelease(s.mappings[1].handle));
  s.handles.erase(s.handles.begin() + 1);
  const unsigned long long refill = create(8 * mib, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  s.handles.push_back(refill);
  VMMCKPT_CHECK(cuMemMap(s.mappings[1].va, 8 * mib, 0, refill, 0));
  VMMCKPT_CHECK(cuMemSetAccess(s.mappings[1].va, 8 * mib, &rw, 1));
  s.mappings[1].handle = refill;
  // A bigger handle after them (cuMemMap takes offset 0 only: "currently must be zero").
  const unsigned long long big = create(16 * mib, CU_MEM_HANDLE_TYPE_NONE);
  s.handles.push_back(big);
  VMMCKPT_CHECK(cuMemMap(s.active + 32 * mib, 16 * mib, 0, big, 0));
  VMMCKPT_CHECK(cuMemSetAccess(s.active + 32 * mib, 16 * mib, &rw, 1));
  s.mappings.push_back({s.active + 32 * mib, 16 * mib, big, 104});
  if (write)
    for (const auto& m : s.mappings) write_pattern(m.va, m.size, m.seed);
  // A retain on an interior address: a second reference to the first mapping's handle.
  CUmemGenericAllocationHandle again = 0;
  VMMCKPT_CHECK(cuMemRetainAllocationHandle(&again, reinterpret_cast<void*>(s.mappings[0].va + mib)));
  VMMCKPT_EXPECT(again == s.mappings[0].handle);
  s.retained = again;
  // Asleep: reserved, nothing mapped.
  s.asleep_size = 32 * mib;
  VMMCKPT_CHECK(cuMemAddressReserve(&va, s.asleep_size, 0, 0, 0));
  s.asleep = va;
  print_ptr(s.asleep, s.asleep_size, "cuMemAddressReserve");
  // And a block of the pool.
  s.block_size = mib;
  VMMCKPT_CHECK(cuMemAlloc(&va, s.block_size));
  s.block = va;
  s.block_seed = 7;
  if (write) write_pattern(s.block, s.block_size, s.block_seed);
  VMMCKPT_CHECK(cuCtxSynchronize());
  return s;
}

// What is wrong with the memory, or an empty string.
std::string problem(const state& s) {
  for (const auto& m : s.mappings) {
    if (!has_pattern(m.va, m.size, m.seed)) return "bytes at " + std::to_string(m.va);
    CUmemGenericAllocationHandle h = 0;
    if (cuMemRetainAllocationHandle(&h, reinterpret_cast<void*>(m.va + m.size - 4096)) != CUDA_SUCCESS)
      return "retain at " + std::to_string(m.va);
    if (h != m.handle) return "token at " + std::to_string(m.va);
    VMMCKPT_CHECK(cuMemRelease(h));
    CUmemAllocationProp prop{};
    VMMCKPT_CHECK(cuMemGetAllocationPropertiesFromHandle(&prop, h));
    if (prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE || prop.location.id != 0)
      return "properties of " + std::to_string(h);
    const unsigned want = m.va == s.mappings[1].va ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
    if (prop.requestedHandleTypes != want) return "handle types of " + std::to_string(h);
  }
  if (!has_pattern(s.block, s.block_size, s.block_seed)) return "bytes of the pool block";
  return {};
}

void finish(state& s) {
  // Waking the sleeping reservation: memory maps there as it did before the checkpoint.
  const unsigned long long woke = create(s.asleep_size, CU_MEM_HANDLE_TYPE_NONE);
  VMMCKPT_CHECK(cuMemMap(s.asleep, s.asleep_size, 0, woke, 0));
  const CUmemAccessDesc rw = read_write(0);
  VMMCKPT_CHECK(cuMemSetAccess(s.asleep, s.asleep_size, &rw, 1));
  write_pattern(s.asleep, s.asleep_size, 9);
  VMMCKPT_EXPECT(has_pattern(s.asleep, s.asleep_size, 9));
  VMMCKPT_CHECK(cuMemUnmap(s.asleep, s.asleep_size));
  VMMCKPT_CHECK(cuMemRelease(woke));
  for (const auto& m : s.mappings) VMMCKPT_CHECK(cuMemUnmap(m.va, m.size));
  for (auto h : s.handles) VMMCKPT_CHECK(cuMemRelease(h));
  VMMCKPT_CHECK(cuMemRelease(s.retained));
  // Every reference is gone now: one more release is refused, as the driver refuses it.
  VMMCKPT_EXPECT(cuMemRelease(s.retained) != CUDA_SUCCESS);
  VMMCKPT_CHECK(cuMemAddressFree(s.active, s.active_size));
  VMMCKPT_CHECK(cuMemAddressFree(s.asleep, s.asleep_size));
  VMMCKPT_CHECK(cuMemFree(s.block));
}

int serve(const std::filesystem::path& dir, state& s) {
  for (int checks = 0, mutations = 0;;) {
    if (std::filesystem::remove(dir / "check")) {
      const std::string why = problem(s);
      if (why.empty())
        std::printf("ok %d\n", ++checks);
      else
        std::printf("bad %s\n", why.c_str());
    }
    if (std::filesystem::remove(dir / "mutate")) {
      for (auto& m : s.mappings) write_pattern(m.va, m.size, m.seed += 1000);
      VMMCKPT_CHECK(cuCtxSynchronize());
      save(dir / "state", s);
      std::printf("mutated %d\n", ++mutations);
    }
    if (std::filesystem::remove(dir / "orphan")) {
      s.handles.push_back(create(2 * mib, CU_MEM_HANDLE_TYPE_NONE));
      std::printf("orphaned\n");
    }
    if (std::filesystem::remove(dir / "finish")) {
      finish(s);
      std::printf("done\n");
      return 0;
    }
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s DIR [--restored]\n", argv[0]);
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  start_cuda();
  state s;
  if (argc == 3 && std::string(argv[2]) == "--restored") {
    s = load(dir / "state");
    const std::string why = problem(s);
    if (!why.empty()) {
      std::printf("bad %s\n", why.c_str());
      return 1;
    }
    std::printf("restored\n");
  } else if (argc == 3 && std::string(argv[2]) == "--replayed") {
    const state saved = load(dir / "state");
    s = build(false);
    for (std::size_t i = 0; i < s.mappings.size(); ++i) s.mappings[i].seed = saved.mappings[i].seed;
    const bool same_layout = s.active == saved.active && s.asleep == saved.asleep && s.block == saved.block &&
                             s.handles == saved.handles && s.retained == saved.retained &&
                             s.mappings.size() == saved.mappings.size();
    const std::string why = same_layout ? problem(s) : "layout differs from the dumped run's";
    if (!why.empty()) {
      std::printf("bad %s\n", why.c_str());
      return 1;
    }
    std::printf("replayed\n");
  } else {
    s = build(true);
    save(dir / "state", s);
    std::printf("ready\n");
  }
  std::fflush(stdout);
  return serve(dir, s);
}
