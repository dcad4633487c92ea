// What the parts of the stand-in NCCL (fake_nccl*.cpp) share: the communicator, its ranks' shared buffers, the
// work it queues on streams, and how its parts report a failure.
#pragma once

#include <cuda.h>
#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "fake_nccl.h"

namespace fake_nccl {

constexpr int max_ranks = 64;
constexpr std::size_t granularity = std::size_t{2} << 20;  // the driver's VMM granularity (the emulator's too)
// A rank's slot: one region that holds its contribution to one step of a collective, then one region per receiving
// peer for point-to-point messages (a message must fit in it).
constexpr std::size_t coll_region = std::size_t{1} << 20;
constexpr std::size_t p2p_region = std::size_t{512} << 10;
constexpr std::size_t flags_size = granularity;

// The sequence numbers a rank publishes in its host-located flags buffer, read by its peers through their mappings
// of it. A rank writes only its own; all are monotonic, so no number is ever confused with another call's.
struct rank_flags {
  alignas(64) std::uint64_t ready;             // the last collective step whose contribution is in my slot
  alignas(64) std::uint64_t done;              // the last collective step for which I finished reading the slots
  alignas(64) std::uint64_t sent[max_ranks];   // per receiver: messages deposited in my slot's region for it
  alignas(64) std::uint64_t acked[max_ranks];  // per sender: its messages I have copied out of its slot
};
static_assert(sizeof(rank_flags) <= flags_size);

// A buffer mapped with the VMM API: a rank's own (created here) or a peer's (imported).
struct mapping {
  CUdeviceptr va = 0;
  std::size_t size = 0;
  CUmemGenericAllocationHandle handle = 0;
  bool mapped = false;
};

struct peer {
  int device = 0;
  pid_t pid = 0;
  mapping slot, flags;  // for the rank itself, its own buffers
};

// What each rank tells the others at bootstrap.
struct rank_info {
  int rank = 0;
  int device = 0;
  pid_t pid = 0;
  std::uint64_t slot_size = 0;
};

// The bootstrap channel: rank 0 is the hub, with a connection to every other rank; the others hold one to it.
struct bootstrap {
  std::vector<int> to_rank;  // rank 0: connection per rank (-1 for itself)
  int to_hub = -1;           // other ranks
};

}  // namespace fake_nccl

struct ncclComm {
  int rank = 0, nranks = 0, device = 0;
  CUcontext ctx = nullptr;
  std::string name;  // from the unique id; names the bootstrap socket and, with a sequence number, each split's
  int splits = 0;
  fake_nccl::bootstrap boot;
  std::vector<fake_nccl::peer> peers;  // by rank

  // The calling side, under the launch mutex (fake_nccl.cpp): the numbers the next operations take. Every rank
  // issues the same operations in the same order, so every rank gives an operation the same numbers.
  std::uint64_t next_step = 1;              // collective steps (one per chunk)
  std::uint64_t next_ticket = 1;            // this process's launches touching the communicator, in issue order
  std::vector<std::uint64_t> sends, recvs;  // messages issued, per peer

  // The running side (host functions on streams).
  std::atomic<std::uint64_t> tickets_done{0};
  std::atomic<int> in_flight{0};
  std::atomic<int> async_error{ncclSuccess};
  std::atomic<bool> aborted{false};

  char* slot_of(int r) const { return reinterpret_cast<char*>(peers[r].slot.va); }
  fake_nccl::rank_flags* flags_of(int r) const { return reinterpret_cast<fake_nccl::rank_flags*>(peers[r].flags.va); }
};

namespace fake_nccl {

enum class kind { all_reduce, broadcast, reduce, all_gather, reduce_scatter, send, recv };

// One operation as issued, with the numbers it takes when launched.
struct op {
  kind what = kind::all_reduce;
  const char* send = nullptr;
  char* recv = nullptr;
  std::size_t count = 0;  // all_gather: sendcount; reduce_scatter: recvcount
  ncclDataType_t type = ncclInt8;
  ncclRedOp_t red = ncclSum;
  int root = 0;  // broadcast and reduce: the root; send and recv: the peer
  ncclComm* comm = nullptr;
  CUstream stream = nullptr;
  std::uint64_t first_step = 0, steps = 0;  // collectives
  std::uint64_t message = 0;                // send and recv: the message's number between the two ranks
};

// The operations of one stream of a group, run by one host function.
struct launch {
  std::vector<op> ops;
  std::vector<std::pair<ncclComm*, std::uint64_t>> tickets;  // one per communicator it touches
};

// fake_nccl_kernels.cpp
std::size_t type_size(ncclDataType_t type);  // 0: a type the stand-in does not reduce or move
bool supported_reduction(ncclDataType_t type, ncclRedOp_t red);
std::uint64_t steps_of(const op& o);
void CUDA_CB run_launch(void* launch_ptr);

// fake_nccl_bootstrap.cpp
ncclResult_t bootstrap_connect(ncclComm& comm);
// Every rank's `bytes` bytes, in rank order, through the hub.
ncclResult_t bootstrap_allgather(ncclComm& comm, const void* mine, std::size_t bytes, void* all);
// Each rank gives each other rank a pair of descriptors of its own (`for_peer[2 * r]`, `[2 * r + 1]`: for rank r) and
// gets theirs (`from_peer`, the same way; new descriptors it must close), through the hub. One pair per importer:
// NCCL exports a handle for every peer that imports it, and the shim tells each exported FD's importer once.
ncclResult_t bootstrap_send_fds(ncclComm& comm, const int* for_peer, int* from_peer);
ncclResult_t bootstrap_barrier(ncclComm& comm);
void bootstrap_close(ncclComm& comm);

// fake_nccl_memory.cpp
ncclResult_t create_own_buffers(ncclComm& comm);
// A pair (slot, flags) of new POSIX FDs for every peer: fds[2 * r], fds[2 * r + 1] for rank r (-1 for itself).
ncclResult_t export_own_buffers(const ncclComm& comm, int* fds);
ncclResult_t import_peer_buffers(ncclComm& comm, int r, const rank_info& info, const int fds[2]);
void free_peer_buffers(ncclComm& comm);
void free_own_buffers(ncclComm& comm);

// One line on stderr naming the rank, as NCCL's warnings do.
[[gnu::format(printf, 2, 3)]] void warn(const ncclComm* comm, const char* format, ...);

const char* cuda_error_name(CUresult r);

}  // namespace fake_nccl

// A failed driver call: one line naming it, and ncclUnhandledCudaError.
#define FAKE_NCCL_CU(comm, call)                                                                      \
  do {                                                                                                \
    const CUresult fake_nccl_r = (call);                                                              \
    if (fake_nccl_r != CUDA_SUCCESS) {                                                                \
      ::fake_nccl::warn(comm, "%s failed: %s (%d)", #call, ::fake_nccl::cuda_error_name(fake_nccl_r), \
                        static_cast<int>(fake_nccl_r));                                               \
      return ncclUnhandledCudaError;                                                                  \
    }                                                                                                 \
  } while (0)

#define FAKE_NCCL_TRY(call)                                 \
  do {                                                      \
    const ncclResult_t fake_nccl_res = (call);              \
    if (fake_nccl_res != ncclSuccess) return fake_nccl_res; \
  } while (0)
