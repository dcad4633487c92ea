// A stand-in libnccl.so.2 for the emulated driver: NCCL's C API with real exchanges between processes through
// imported cuMem memory and real waits on the peers (so that a rank held back holds the others), for the tests of
// checkpoints of multi-rank jobs, where there is neither a GPU nor NCCL. This file: the API, groups, communicators.
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <thread>

#include "fake_nccl_internal.hpp"

namespace fake_nccl {

const char* cuda_error_name(CUresult r) {
  const char* name = nullptr;
  return cuGetErrorName(r, &name) == CUDA_SUCCESS && name != nullptr ? name : "?";
}

void warn(const ncclComm* comm, const char* format, ...) {
  char line[1024];
  int n = comm != nullptr ? std::snprintf(line, sizeof line, "fake nccl rank %d/%d: ", comm->rank, comm->nranks)
                          : std::snprintf(line, sizeof line, "fake nccl: ");
  va_list args;
  va_start(args, format);
  n += std::vsnprintf(line + n, sizeof line - static_cast<std::size_t>(n), format, args);
  va_end(args);
  n = std::min(n, static_cast<int>(sizeof line) - 2);
  line[n++] = '\n';
  [[maybe_unused]] const ssize_t written = write(2, line, static_cast<std::size_t>(n));  // one write: one line
}

}  // namespace fake_nccl

namespace {

using namespace fake_nccl;

constexpr char id_magic[] = "vmmckpt-fake-nccl:";

thread_local int group_depth = 0;
thread_local std::vector<op> grouped;
thread_local ncclResult_t group_error = ncclSuccess;
std::mutex launch_mutex;  // numbers and launches in one order

// The C API never lets an exception out.
template <class F>
ncclResult_t guarded(F&& f) noexcept {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    warn(nullptr, "out of host memory");
    return ncclSystemError;
  } catch (const std::exception& e) {
    warn(nullptr, "%s", e.what());
    return ncclInternalError;
  }
}

ncclResult_t invalid(const ncclComm* comm, const char* what) {
  warn(comm, "invalid argument: %s", what);
  return ncclInvalidArgument;
}

void wait_for_work(const ncclComm& comm) {
  while (comm.in_flight.load(std::memory_order_acquire) > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

// Frees what a communicator holds. `barrier`: the ranks wait for each other between unmapping the peers' buffers and
// freeing their own, so that no rank frees memory a peer still maps (skipped when aborting).
void teardown(ncclComm* comm, bool barrier) {
  wait_for_work(*comm);
  free_peer_buffers(*comm);
  if (barrier && bootstrap_barrier(*comm) != ncclSuccess) warn(comm, "the barrier before freeing failed");
  free_own_buffers(*comm);
  bootstrap_close(*comm);
  delete comm;
}

// Own buffers made, the bootstrap connected, every rank's information gathered, a pair of POSIX FDs of its buffers
// exported for each peer and theirs received, and every peer's buffers imported and mapped.
ncclResult_t set_up(ncclComm& comm) {
  FAKE_NCCL_TRY(create_own_buffers(comm));
  const std::size_t n = static_cast<std::size_t>(comm.nranks);
  std::vector<rank_info> infos(n);
  std::vector<int> mine(2 * n, -1), theirs(2 * n, -1);
  const rank_info info{comm.rank, comm.device, getpid(), comm.peers[static_cast<std::size_t>(comm.rank)].slot.size};
  ncclResult_t result = bootstrap_connect(comm);
  if (result == ncclSuccess) result = bootstrap_allgather(comm, &info, sizeof info, infos.data());
  if (result == ncclSuccess) result = export_own_buffers(comm, mine.data());
  if (result == ncclSuccess) result = bootstrap_send_fds(comm, mine.data(), theirs.data());
  for (std::size_t r = 0; r < n && result == ncclSuccess; ++r)
    if (static_cast<int>(r) != comm.rank)
      result = import_peer_buffers(comm, static_cast<int>(r), infos[r], &theirs[2 * r]);
  for (int fd : mine)
    if (fd >= 0) close(fd);
  for (int fd : theirs)
    if (fd >= 0) close(fd);
  return result;
}

// `ctx`: the context whose device the communicator uses; null: the calling thread's (device 0's primary if none).
ncclResult_t init_comm(ncclComm** out, const std::string& name, int nranks, int rank, CUcontext ctx) {
  *out = nullptr;
  if (nranks < 1 || nranks > max_ranks) return invalid(nullptr, "nranks must be 1 to 64");
  if (rank < 0 || rank >= nranks) return invalid(nullptr, "rank out of range");
  FAKE_NCCL_CU(nullptr, cuInit(0));
  if (ctx == nullptr) FAKE_NCCL_CU(nullptr, cuCtxGetCurrent(&ctx));
  if (ctx == nullptr) {
    FAKE_NCCL_CU(nullptr, cuDevicePrimaryCtxRetain(&ctx, 0));
    FAKE_NCCL_CU(nullptr, cuCtxSetCurrent(ctx));
  }
  auto comm = std::make_unique<ncclComm>();
  comm->rank = rank;
  comm->nranks = nranks;
  comm->ctx = ctx;
  comm->name = name;
  comm->peers.resize(static_cast<std::size_t>(nranks));
  comm->sends.assign(static_cast<std::size_t>(nranks), 0);
  comm->recvs.assign(static_cast<std::size_t>(nranks), 0);
  FAKE_NCCL_CU(comm.get(), cuCtxPushCurrent(ctx));
  CUdevice device = 0;
  const CUresult got = cuCtxGetDevice(&device);
  CUcontext popped = nullptr;
  cuCtxPopCurrent(&popped);
  FAKE_NCCL_CU(comm.get(), got);
  comm->device = static_cast<int>(device);
  const ncclResult_t result = set_up(*comm);
  if (result != ncclSuccess) {
    teardown(comm.release(), false);
    return result;
  }
  *out = comm.release();
  return ncclSuccess;
}

ncclResult_t check_op(const op& o) {
  const ncclComm* c = o.comm;
  if (c == nullptr) return invalid(nullptr, "the communicator is null");
  if (c->aborted.load()) return invalid(c, "the communicator was aborted");
  const std::size_t e = type_size(o.type);
  if (e == 0) return invalid(c, "unknown data type");
  const bool p2p = o.what == kind::send || o.what == kind::recv;
  const bool reduces = o.what == kind::all_reduce || o.what == kind::reduce || o.what == kind::reduce_scatter;
  if (reduces && !supported_reduction(o.type, o.red))
    return invalid(c, "a reduction of a type or operation not supported");
  if ((o.what == kind::broadcast || o.what == kind::reduce || p2p) && (o.root < 0 || o.root >= c->nranks))
    return invalid(c, p2p ? "peer out of range" : "root out of range");
  if (p2p && o.count * e > p2p_region) return invalid(c, "a point-to-point message larger than 512 KiB");
  const bool sends = o.what != kind::recv && (o.what != kind::broadcast || c->rank == o.root);
  const bool receives = o.what != kind::send && (o.what != kind::reduce || c->rank == o.root);
  if (o.count > 0 && ((sends && o.send == nullptr) || (receives && o.recv == nullptr)))
    return invalid(c, "a null buffer");
  return ncclSuccess;
}

// The numbers an operation takes when launched: its collective steps, or its message's number with the peer.
void number(op& o) {
  ncclComm& c = *o.comm;
  const std::size_t peer = static_cast<std::size_t>(o.root);
  if (o.what == kind::send) {
    o.message = ++c.sends[peer];
  } else if (o.what == kind::recv) {
    o.message = ++c.recvs[peer];
  } else {
    o.steps = steps_of(o);
    o.first_step = c.next_step;
    c.next_step += o.steps;
  }
}

// One host function for the operations on `stream`, in issue order.
ncclResult_t launch_stream(std::vector<op>& ops, CUstream stream) {
  auto l = std::make_unique<launch>();
  for (op& o : ops) {
    if (o.stream != stream) continue;
    number(o);
    l->ops.push_back(o);
    const bool known = std::any_of(l->tickets.begin(), l->tickets.end(), [&](auto& t) { return t.first == o.comm; });
    if (!known) l->tickets.emplace_back(o.comm, o.comm->next_ticket++);
  }
  for (auto& [c, ticket] : l->tickets) c->in_flight.fetch_add(1, std::memory_order_acq_rel);
  const CUresult r = cuLaunchHostFunc(stream, run_launch, l.get());
  if (r == CUDA_SUCCESS) {
    l.release();  // run_launch owns it
    return ncclSuccess;
  }
  for (auto& [c, ticket] : l->tickets) {
    warn(c, "cuLaunchHostFunc failed: %s (%d)", cuda_error_name(r), static_cast<int>(r));
    int none = ncclSuccess;
    c->async_error.compare_exchange_strong(none, ncclUnhandledCudaError);  // its numbers are out of step now
    c->in_flight.fetch_sub(1, std::memory_order_acq_rel);
  }
  return ncclUnhandledCudaError;
}

ncclResult_t launch_all(std::vector<op>& ops) {
  std::lock_guard lock(launch_mutex);
  std::vector<CUstream> streams;
  for (const op& o : ops)
    if (std::find(streams.begin(), streams.end(), o.stream) == streams.end()) streams.push_back(o.stream);
  ncclResult_t result = ncclSuccess;
  for (CUstream s : streams) {
    const ncclResult_t r = launch_stream(ops, s);
    if (result == ncclSuccess) result = r;
  }
  return result;
}

// An operation: checked, then queued in the group or launched alone (as NCCL, an implicit group of one).
ncclResult_t issue(const op& o) {
  const ncclResult_t r = check_op(o);
  if (r != ncclSuccess) {
    if (group_depth > 0 && group_error == ncclSuccess) group_error = r;
    return r;
  }
  if (group_depth > 0) {
    grouped.push_back(o);
    return ncclSuccess;
  }
  std::vector<op> one{o};
  return launch_all(one);
}

op make_op(kind what, const void* send, void* recv, std::size_t count, ncclDataType_t type, ncclRedOp_t red, int root,
           ncclComm_t comm, cudaStream_t stream) {
  op o;
  o.what = what;
  o.send = static_cast<const char*>(send);
  o.recv = static_cast<char*>(recv);
  o.count = count;
  o.type = type;
  o.red = red;
  o.root = root;
  o.comm = comm;
  o.stream = stream;
  return o;
}

ncclResult_t init_from_id(ncclComm_t* comm, int nranks, const ncclUniqueId& id, int rank) {
  if (comm == nullptr) return invalid(nullptr, "comm is null");
  *comm = nullptr;
  const std::string name(id.internal, strnlen(id.internal, sizeof id.internal));
  if (name.rfind(id_magic, 0) != 0) return invalid(nullptr, "not a unique id of ncclGetUniqueId");
  return init_comm(comm, name, nranks, rank, nullptr);
}

struct split_entry {
  int color = 0, key = 0;
};

// Every rank's color and key over the parent's bootstrap; then the ranks of one color make a communicator of their
// own, ordered by key then parent rank, bootstrapped on a socket named from the parent's id, the split's number and
// the color.
ncclResult_t split(ncclComm* parent, int color, int key, ncclComm** out) {
  *out = nullptr;
  if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
    return invalid(parent, "a negative color other than NCCL_SPLIT_NOCOLOR");
  wait_for_work(*parent);  // NCCL's split is ordered after the parent's work too
  const split_entry mine{color, key};
  std::vector<split_entry> all(static_cast<std::size_t>(parent->nranks));
  FAKE_NCCL_TRY(bootstrap_allgather(*parent, &mine, sizeof mine, all.data()));
  const int number = ++parent->splits;
  if (color == NCCL_SPLIT_NOCOLOR) return ncclSuccess;
  std::vector<int> members;
  for (int r = 0; r < parent->nranks; ++r)
    if (all[static_cast<std::size_t>(r)].color == color) members.push_back(r);
  std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
    return all[static_cast<std::size_t>(a)].key < all[static_cast<std::size_t>(b)].key;
  });
  const int rank = static_cast<int>(std::find(members.begin(), members.end(), parent->rank) - members.begin());
  const std::string name = parent->name + "/split" + std::to_string(number) + "/color" + std::to_string(color);
  return init_comm(out, name, static_cast<int>(members.size()), rank, parent->ctx);
}

}  // namespace

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return invalid(nullptr, "version is null");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (id == nullptr) return invalid(nullptr, "uniqueId is null");
  unsigned char random[8];
  if (getrandom(random, sizeof random, 0) != static_cast<ssize_t>(sizeof random)) {
    warn(nullptr, "getrandom failed: %s", std::strerror(errno));
    return ncclSystemError;
  }
  std::memset(id->internal, 0, sizeof id->internal);
  int n = std::snprintf(id->internal, sizeof id->internal, "%s", id_magic);
  for (unsigned char b : random)
    n += std::snprintf(id->internal + n, sizeof id->internal - static_cast<std::size_t>(n), "%02x", b);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  return guarded([&] { return init_from_id(comm, nranks, commId, rank); });
}

// Always blocking; nothing else in a configuration applies here. (Not through ncclCommInitRank: a preloaded library
// that interposes both would see the one call twice.)
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t*) {
  return guarded([&] { return init_from_id(comm, nranks, commId, rank); });
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t*) {
  return guarded([&] {
    if (comm == nullptr || newcomm == nullptr) return invalid(comm, "comm or newcomm is null");
    return split(comm, color, key, newcomm);
  });
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (comm == nullptr) return invalid(nullptr, "comm is null");
  wait_for_work(*comm);
  return static_cast<ncclResult_t>(comm->async_error.load());
}

// The barrier only when all is well: after an error or an abort, a peer may be gone or never come.
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  return guarded([&] {
    teardown(comm, !comm->aborted.load() && comm->async_error.load() == ncclSuccess);
    return ncclSuccess;
  });
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  comm->aborted.store(true);  // the waits give up
  return guarded([&] {
    teardown(comm, false);
    return ncclSuccess;
  });
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (comm == nullptr || count == nullptr) return invalid(comm, "comm or count is null");
  *count = comm->nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (comm == nullptr || rank == nullptr) return invalid(comm, "comm or rank is null");
  *rank = comm->rank;
  return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  if (comm == nullptr || device == nullptr) return invalid(comm, "comm or device is null");
  *device = comm->device;
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  if (comm == nullptr || asyncError == nullptr) return invalid(comm, "comm or asyncError is null");
  *asyncError = static_cast<ncclResult_t>(comm->async_error.load());
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  return guarded(
      [&] { return issue(make_op(kind::all_reduce, sendbuff, recvbuff, count, datatype, op, 0, comm, stream)); });
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  return guarded([&] {
    return issue(make_op(kind::broadcast, sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream));
  });
}

ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                       cudaStream_t stream) {
  return guarded(
      [&] { return issue(make_op(kind::broadcast, buff, buff, count, datatype, ncclSum, root, comm, stream)); });
}

ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream) {
  return guarded(
      [&] { return issue(make_op(kind::reduce, sendbuff, recvbuff, count, datatype, op, root, comm, stream)); });
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
  return guarded([&] {
    return issue(make_op(kind::all_gather, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0, comm, stream));
  });
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return guarded([&] {
    return issue(make_op(kind::reduce_scatter, sendbuff, recvbuff, recvcount, datatype, op, 0, comm, stream));
  });
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return guarded(
      [&] { return issue(make_op(kind::send, sendbuff, nullptr, count, datatype, ncclSum, peer, comm, stream)); });
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return guarded(
      [&] { return issue(make_op(kind::recv, nullptr, recvbuff, count, datatype, ncclSum, peer, comm, stream)); });
}

ncclResult_t ncclGroupStart(void) {
  ++group_depth;
  return ncclSuccess;
}

// The outermost end launches the group's operations together: one host function per stream.
ncclResult_t ncclGroupEnd(void) {
  if (group_depth == 0) {
    warn(nullptr, "ncclGroupEnd without ncclGroupStart");
    return ncclInvalidUsage;
  }
  if (--group_depth > 0) return ncclSuccess;
  std::vector<op> ops = std::move(grouped);
  grouped.clear();
  const ncclResult_t error = std::exchange(group_error, ncclSuccess);
  if (error != ncclSuccess) return error;  // as NCCL: a group with a bad operation launches nothing
  return guarded([&] { return ops.empty() ? ncclSuccess : launch_all(ops); });
}

}  // extern "C"
