// Emulator test program: one rank of a multi-rank NCCL job (on the stand-in libnccl.so.2), started by
// emu_collective_job, whose results every rank checks exactly, step by step.
//
//   emu_collective_rank DIR RANK NRANKS STEPS [--step-ms MS]
//
// It uses device RANK % (the devices the driver reports), takes the unique id from DIR/uid (rank 0 makes it), makes
// a communicator of all ranks and one split from it (color RANK % 2 from 4 ranks on, else one color; key NRANKS -
// RANK, so the split's ranks are in reverse order), a 1 MiB buffer from cuMemAlloc and a 2 MiB one it maps itself.
// Each step s: an int64 allreduce, a ring exchange (send to the next rank, receive from the one before, in one
// group), an int32 allgather, a uint64 broadcast from rank s % NRANKS (two collective steps of the stand-in) and a
// float64 allreduce on the split communicator. Every rank's data is a function of (rank, s, the results of step
// s - 1 that every rank shares), so each rank knows what every value must be. Lines, on stdout:
//   pid RANK PID            at start
//   ready RANK              the communicators and buffers made
//   step RANK S             every 10 steps (and DIR/RANK.step holds the last step done, for the tests)
//   done RANK STEPS HASH    the end: a hash of its last results, the same in every run of the same job
//   bad RANK S WHAT         the first wrong value; exit 1
// A failed CUDA or NCCL call prints the call and its error on stderr; exit 2.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "fake_nccl.h"
#include "vmm_support.hpp"

namespace fs = std::filesystem;

namespace {

int g_rank = -1;

[[noreturn]] void call_failed(const char* call, const char* error, int code) {
  std::fprintf(stderr, "rank %d: %s failed: %s (%d)\n", g_rank, call, error, code);
  std::fflush(stderr);
  std::exit(2);
}

void cu_check(CUresult r, const char* call) {
  if (r != CUDA_SUCCESS) call_failed(call, vmmckpt::programs::error_name(r), static_cast<int>(r));
}
void nccl_check(ncclResult_t r, const char* call) {
  if (r != ncclSuccess) call_failed(call, ncclGetErrorString(r), static_cast<int>(r));
}
#define CU(call) cu_check((call), #call)
#define NC(call) nccl_check((call), #call)

struct options {
  fs::path dir;
  int rank = 0, nranks = 1, steps = 1, step_ms = 20;
};

// Where the data lives. The 1 MiB cuMemAlloc buffer:
constexpr std::size_t kib = 1024;
constexpr std::size_t sum_count = 32768;  // int64 allreduce: sent from 0, result at 256 KiB
constexpr std::size_t sum_send = 0, sum_recv = 256 * kib;
constexpr std::size_t ring_count = 16384;  // int64 ring: sent from 512 KiB, received at 640 KiB
constexpr std::size_t ring_send = 512 * kib, ring_recv = 640 * kib;
constexpr std::size_t split_count = 16384;  // float64 allreduce on the split communicator, in place at 768 KiB
constexpr std::size_t split_at = 768 * kib;
// The 2 MiB VMM buffer:
constexpr std::size_t gather_count = 16384;  // int32 allgather: sent from 0, the ranks' blocks from 64 KiB
constexpr std::size_t gather_send = 0, gather_recv = 64 * kib;
constexpr std::size_t bcast_count = 163840;  // uint64 broadcast in place at 768 KiB, to the buffer's end
constexpr std::size_t bcast_at = 768 * kib;
constexpr int max_job_ranks = 8;  // the allgather's blocks end before the broadcast's bytes

std::uint64_t mix(std::uint64_t x) {  // splitmix64's finalizer
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Rank `rank`'s elements of stream `what` at step `step`, after shared results that hash to `carry`: a splitmix64
// sequence from a seed of them all.
struct values {
  std::uint64_t seed;
  values(std::uint64_t carry, int rank, int step, int what)
      : seed(mix(carry ^ mix((std::uint64_t(what) << 56) ^ (std::uint64_t(rank) << 40) ^ std::uint64_t(step)))) {}
  std::uint64_t operator()(std::size_t i) const { return mix(seed + i * 0x9e3779b97f4a7c15ULL); }
  double real(std::size_t i) const { return static_cast<double>((*this)(i) >> 20); }  // < 2^44: sums of 8 are exact
};

template <class T>
std::uint64_t hash_of(std::uint64_t h, const std::vector<T>& v) {
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());
  for (std::size_t i = 0; i < v.size() * sizeof(T); ++i) h = (h ^ p[i]) * 1099511628211ULL;
  return h;
}

struct job {
  options opt;
  int device = 0;
  ncclComm_t world = nullptr, split = nullptr;
  std::vector<int> split_members;  // parent ranks, in split rank order
  CUstream stream = nullptr;
  CUdeviceptr plain = 0;   // cuMemAlloc, 1 MiB
  CUdeviceptr mapped = 0;  // cuMemCreate + map, 2 MiB
  CUmemGenericAllocationHandle mapped_handle = 0;
  std::uint64_t carry = 0;  // a hash of the shared results of the step before
  // The host side of one step: what this rank sends, then what came back.
  std::vector<std::int64_t> sum_in, sum_out, ring_in, ring_out;
  std::vector<std::int32_t> gather_in, gather_out;
  std::vector<std::uint64_t> bcast;
  std::vector<double> split_data;
};

options parse(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s DIR RANK NRANKS STEPS [--step-ms MS]\n", argv[0]);
    std::exit(2);
  }
  options o;
  o.dir = argv[1];
  o.rank = std::atoi(argv[2]);
  o.nranks = std::atoi(argv[3]);
  o.steps = std::atoi(argv[4]);
  for (int i = 5; i + 1 < argc; i += 2)
    if (std::string(argv[i]) == "--step-ms") o.step_ms = std::atoi(argv[i + 1]);
  if (o.nranks < 1 || o.nranks > max_job_ranks || o.rank < 0 || o.rank >= o.nranks || o.steps < 0) {
    std::fprintf(stderr, "bad arguments: rank %d of %d (1 to %d ranks), %d steps\n", o.rank, o.nranks, max_job_ranks,
                 o.steps);
    std::exit(2);
  }
  return o;
}

// Written whole and renamed into place, so that a reader never sees half of it.
void write_atomically(const fs::path& file, const void* data, std::size_t bytes) {
  const fs::path tmp = file.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
    if (!out) call_failed(("writing " + tmp.string()).c_str(), std::strerror(errno), errno);
  }
  fs::rename(tmp, file);
}

ncclUniqueId unique_id(const options& o) {
  ncclUniqueId id{};
  const fs::path file = o.dir / "uid";
  if (o.rank == 0) {
    NC(ncclGetUniqueId(&id));
    write_atomically(file, &id, sizeof id);
    return id;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (;;) {
    std::ifstream in(file, std::ios::binary);
    if (in.read(id.internal, sizeof id.internal)) return id;
    if (std::chrono::steady_clock::now() > deadline)
      call_failed(("reading " + file.string()).c_str(), "no id after 60 s", 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void start_device(job& j) {
  CU(cuInit(0));
  int devices = 0;
  CU(cuDeviceGetCount(&devices));
  if (devices < 1) call_failed("cuDeviceGetCount", "no device", 0);
  j.device = j.opt.rank % devices;
  CUcontext ctx = nullptr;
  CU(cuDevicePrimaryCtxRetain(&ctx, j.device));
  CU(cuCtxSetCurrent(ctx));
}

// The split's ranks, as the rank computes them: one color below 4 ranks, else by parity; ordered by key.
void make_communicators(job& j) {
  const options& o = j.opt;
  NC(ncclCommInitRank(&j.world, o.nranks, unique_id(o), o.rank));
  const auto color_of = [&](int r) { return o.nranks >= 4 ? r % 2 : 0; };
  NC(ncclCommSplit(j.world, color_of(o.rank), o.nranks - o.rank, &j.split, nullptr));
  for (int r = o.nranks - 1; r >= 0; --r)  // keys nranks - r: the highest rank first
    if (color_of(r) == color_of(o.rank)) j.split_members.push_back(r);
  int count = 0, rank = 0, device = -1;
  NC(ncclCommCount(j.split, &count));
  NC(ncclCommUserRank(j.split, &rank));
  NC(ncclCommCuDevice(j.world, &device));
  const int expected =
      static_cast<int>(std::find(j.split_members.begin(), j.split_members.end(), o.rank) - j.split_members.begin());
  if (count != static_cast<int>(j.split_members.size()) || rank != expected || device != j.device) {
    std::printf("bad %d 0 split: rank %d of %d, device %d\n", o.rank, rank, count, device);
    std::exit(1);
  }
}

void make_buffers(job& j) {
  CU(cuStreamCreate(&j.stream, CU_STREAM_NON_BLOCKING));
  CU(cuMemAlloc(&j.plain, 1024 * kib));
  const CUmemAllocationProp prop = vmmckpt::programs::device_prop(j.device, CU_MEM_HANDLE_TYPE_NONE);
  const std::size_t size = 2048 * kib;
  CU(cuMemCreate(&j.mapped_handle, size, &prop, 0));
  CU(cuMemAddressReserve(&j.mapped, size, 0, 0, 0));
  CU(cuMemMap(j.mapped, size, 0, j.mapped_handle, 0));
  const CUmemAccessDesc access = vmmckpt::programs::read_write(j.device);
  CU(cuMemSetAccess(j.mapped, size, &access, 1));
  const std::size_t n = static_cast<std::size_t>(j.opt.nranks);
  j.sum_in.resize(sum_count);
  j.sum_out.resize(sum_count);
  j.ring_in.resize(ring_count);
  j.ring_out.resize(ring_count);
  j.gather_in.resize(gather_count);
  j.gather_out.resize(n * gather_count);
  j.bcast.resize(bcast_count);
  j.split_data.resize(split_count);
}

// This rank's data for step s, onto the device. A broadcast's non-roots get a filler the broadcast must replace.
void fill(job& j, int s) {
  const int me = j.opt.rank, root = s % j.opt.nranks;
  const values sum(j.carry, me, s, 1), ring(j.carry, me, s, 2), gather(j.carry, me, s, 3), split(j.carry, me, s, 5);
  for (std::size_t i = 0; i < sum_count; ++i) j.sum_in[i] = static_cast<std::int64_t>(sum(i));
  for (std::size_t i = 0; i < ring_count; ++i) j.ring_in[i] = static_cast<std::int64_t>(ring(i));
  for (std::size_t i = 0; i < gather_count; ++i)
    j.gather_in[i] = static_cast<std::int32_t>(static_cast<std::uint32_t>(gather(i)));
  for (std::size_t i = 0; i < split_count; ++i) j.split_data[i] = split.real(i);
  CU(cuMemcpyHtoDAsync(j.plain + sum_send, j.sum_in.data(), sum_count * 8, j.stream));
  CU(cuMemcpyHtoDAsync(j.plain + ring_send, j.ring_in.data(), ring_count * 8, j.stream));
  CU(cuMemcpyHtoDAsync(j.plain + split_at, j.split_data.data(), split_count * 8, j.stream));
  CU(cuMemcpyHtoDAsync(j.mapped + gather_send, j.gather_in.data(), gather_count * 4, j.stream));
  if (me == root) {
    const values bcast(j.carry, me, s, 4);
    for (std::size_t i = 0; i < bcast_count; ++i) j.bcast[i] = bcast(i);
    CU(cuMemcpyHtoDAsync(j.mapped + bcast_at, j.bcast.data(), bcast_count * 8, j.stream));
  } else {
    CU(cuMemsetD32Async(j.mapped + bcast_at, 0xdeadbeef, bcast_count * 2, j.stream));
  }
}

void communicate(job& j, int s) {
  const int me = j.opt.rank, n = j.opt.nranks;
  const auto p = [](CUdeviceptr d) { return reinterpret_cast<void*>(d); };
  NC(ncclAllReduce(p(j.plain + sum_send), p(j.plain + sum_recv), sum_count, ncclInt64, ncclSum, j.world, j.stream));
  NC(ncclGroupStart());
  NC(ncclSend(p(j.plain + ring_send), ring_count, ncclInt64, (me + 1) % n, j.world, j.stream));
  NC(ncclRecv(p(j.plain + ring_recv), ring_count, ncclInt64, (me - 1 + n) % n, j.world, j.stream));
  NC(ncclGroupEnd());
  NC(ncclAllGather(p(j.mapped + gather_send), p(j.mapped + gather_recv), gather_count, ncclInt32, j.world, j.stream));
  NC(ncclBroadcast(p(j.mapped + bcast_at), p(j.mapped + bcast_at), bcast_count, ncclUint64, s % n, j.world, j.stream));
  NC(ncclAllReduce(p(j.plain + split_at), p(j.plain + split_at), split_count, ncclFloat64, ncclSum, j.split, j.stream));
  CU(cuStreamSynchronize(j.stream));
  for (ncclComm_t c : {j.world, j.split}) {
    ncclResult_t async = ncclSuccess;
    NC(ncclCommGetAsyncError(c, &async));
    NC(async);
  }
  CU(cuMemcpyDtoH(j.sum_out.data(), j.plain + sum_recv, sum_count * 8));
  CU(cuMemcpyDtoH(j.ring_out.data(), j.plain + ring_recv, ring_count * 8));
  CU(cuMemcpyDtoH(j.split_data.data(), j.plain + split_at, split_count * 8));
  CU(cuMemcpyDtoH(j.gather_out.data(), j.mapped + gather_recv, j.gather_out.size() * 4));
  CU(cuMemcpyDtoH(j.bcast.data(), j.mapped + bcast_at, bcast_count * 8));
}

[[noreturn]] void bad(const job& j, int s, const char* what, std::size_t i, std::uint64_t got, std::uint64_t want) {
  std::printf("bad %d %d %s[%zu] 0x%" PRIx64 " expected 0x%" PRIx64 "\n", j.opt.rank, s, what, i, got, want);
  std::fflush(stdout);
  std::exit(1);
}

// Every value of step s against what the CPU computes for all the ranks.
void check(const job& j, int s) {
  const int me = j.opt.rank, n = j.opt.nranks;
  std::vector<values> sums, gathers;
  for (int r = 0; r < n; ++r) {
    sums.emplace_back(j.carry, r, s, 1);
    gathers.emplace_back(j.carry, r, s, 3);
  }
  for (std::size_t i = 0; i < sum_count; ++i) {
    std::uint64_t want = 0;
    for (const values& v : sums) want += v(i);
    if (static_cast<std::uint64_t>(j.sum_out[i]) != want)
      bad(j, s, "allreduce", i, static_cast<std::uint64_t>(j.sum_out[i]), want);
  }
  const values ring(j.carry, (me - 1 + n) % n, s, 2);
  for (std::size_t i = 0; i < ring_count; ++i)
    if (static_cast<std::uint64_t>(j.ring_out[i]) != ring(i))
      bad(j, s, "ring", i, static_cast<std::uint64_t>(j.ring_out[i]), ring(i));
  for (int r = 0; r < n; ++r)
    for (std::size_t i = 0; i < gather_count; ++i) {
      const std::size_t at = static_cast<std::size_t>(r) * gather_count + i;
      const auto want = static_cast<std::uint32_t>(gathers[static_cast<std::size_t>(r)](i));
      if (static_cast<std::uint32_t>(j.gather_out[at]) != want)
        bad(j, s, "allgather", at, static_cast<std::uint32_t>(j.gather_out[at]), want);
    }
  const values bcast(j.carry, s % n, s, 4);
  for (std::size_t i = 0; i < bcast_count; ++i)
    if (j.bcast[i] != bcast(i)) bad(j, s, "broadcast", i, j.bcast[i], bcast(i));
  std::vector<values> splits;
  for (int r : j.split_members) splits.emplace_back(j.carry, r, s, 5);
  for (std::size_t i = 0; i < split_count; ++i) {
    double want = 0;
    for (const values& v : splits) want += v.real(i);
    if (j.split_data[i] != want)
      bad(j, s, "split allreduce", i, static_cast<std::uint64_t>(j.split_data[i]), static_cast<std::uint64_t>(want));
  }
}

void run_steps(job& j) {
  const options& o = j.opt;
  const fs::path step_file = o.dir / (std::to_string(o.rank) + ".step");
  for (int s = 1; s <= o.steps; ++s) {
    fill(j, s);
    communicate(j, s);
    check(j, s);
    // The next step's data depends on this one's shared results: a step lost or repeated shows in every later one.
    j.carry = hash_of(hash_of(hash_of(mix(j.carry ^ static_cast<std::uint64_t>(s)), j.sum_out), j.gather_out), j.bcast);
    const std::string text = std::to_string(s) + "\n";
    write_atomically(step_file, text.data(), text.size());
    if (s % 10 == 0) {
      std::printf("step %d %d\n", o.rank, s);
      std::fflush(stdout);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(o.step_ms));
  }
}

void finish(job& j) {
  std::uint64_t h = hash_of(hash_of(hash_of(j.carry, j.ring_out), j.split_data), j.sum_out);
  std::printf("done %d %d %016" PRIx64 "\n", j.opt.rank, j.opt.steps, h);
  std::fflush(stdout);
  NC(ncclCommDestroy(j.split));
  NC(ncclCommDestroy(j.world));
  CU(cuStreamDestroy(j.stream));
  CU(cuMemFree(j.plain));
  CU(cuMemUnmap(j.mapped, 2048 * kib));
  CU(cuMemRelease(j.mapped_handle));
  CU(cuMemAddressFree(j.mapped, 2048 * kib));
}

}  // namespace

int main(int argc, char** argv) {
  job j;
  j.opt = parse(argc, argv);
  g_rank = j.opt.rank;
  std::printf("pid %d %d\n", j.opt.rank, static_cast<int>(getpid()));
  std::fflush(stdout);
  start_device(j);
  make_communicators(j);
  make_buffers(j);
  std::printf("ready %d\n", j.opt.rank);
  std::fflush(stdout);
  run_steps(j);
  finish(j);
  return 0;
}
