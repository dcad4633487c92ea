// The NCCL doors: each call is forwarded unchanged to the program's libnccl, and what it issues is counted per
// communicator for the cut of a multi-rank job (operations/job_cut.hpp, docs/job-checkpoint.md).
//
// The types are declared here with NCCL's ABI (nccl.h is NCCL's, not ours to need): communicators are opaque
// pointers, data types, reduction ops and results are C enums (ints), a unique id is 128 bytes.
#include <cuda.h>

#include <cstddef>

#include "entry/entry_points.hpp"
#include "operations/job_cut.hpp"

namespace {

using nccl_result = int;
using nccl_comm = void*;
struct nccl_unique_id {
  char internal[128];
};
struct nccl_config;    // passed through untouched
struct nccl_sim_info;  // passed through untouched
constexpr nccl_result nccl_system_error = 2;
constexpr nccl_result nccl_in_progress = 7;  // a non-blocking communicator's call goes on in NCCL's own thread
constexpr int nccl_split_nocolor = -1;

// A call that made (or is making) what it was asked: a non-blocking communicator answers ncclInProgress.
bool issued(nccl_result r) { return r == 0 || r == nccl_in_progress; }

using vmmckpt::detail::nccl_symbol;
namespace cut = vmmckpt::detail::job_cut;
using op = cut::operation;

// NCCL calls its own API through its exported names (ncclBcast calls ncclBroadcast), which lands here again: a
// call made from inside another is NCCL's own, neither counted again nor a cut point.
thread_local int t_inside_nccl = 0;
struct nccl_door {
  const bool nested = t_inside_nccl++ > 0;
  ~nccl_door() { --t_inside_nccl; }
};

// The real function, or null when no libnccl is loaded (a caller that found ours by name without NCCL); a call
// from inside NCCL goes straight to it.
#define VMMCKPT_REAL(name, ...)                         \
  static nccl_symbol real_symbol{#name};                \
  const auto real = real_symbol.get<decltype(&name)>(); \
  if (real == nullptr) return nccl_system_error;        \
  const nccl_door door;                                 \
  if (door.nested) return real(__VA_ARGS__)

// A collective's whole door: counted on `comm` for the cut, then forwarded.
#define VMMCKPT_COLLECTIVE(name, comm, ...)            \
  VMMCKPT_REAL(name, __VA_ARGS__);                     \
  const op counted(#name, comm, op::kind::collective); \
  return real(__VA_ARGS__)

// The rank and size of a communicator NCCL made, through NCCL itself.
void rank_and_size(nccl_comm comm, int& rank, int& size) noexcept {
  static nccl_symbol user_rank{"ncclCommUserRank"}, count{"ncclCommCount"};
  rank = size = 0;
  using query = nccl_result (*)(nccl_comm, int*);
  if (const auto f = user_rank.get<query>(); f != nullptr) f(comm, &rank);
  if (const auto f = count.get<query>(); f != nullptr) f(comm, &size);
}

// A split-like call: an operation on the parent, and a new communicator named by the parent's split count.
template <typename Call>
nccl_result split_like(const char* name, nccl_comm parent, int color, nccl_comm* made, Call&& call) noexcept {
  const std::uint64_t id = cut::id_of_split(parent, color, name);
  // A rank that makes no new communicator still takes part in the split: counted on the parent alone.
  cut::creation created(name, id, color == nccl_split_nocolor || made == nullptr ? -2 : -1, 0, parent);
  if (color == nccl_split_nocolor || made == nullptr) return call();
  int rank = 0, size = 0;
  const nccl_result r = call();
  if (issued(r) && *made != nullptr) {
    rank_and_size(*made, rank, size);  // a non-blocking split may not say yet: the communicator then goes unreported
    created.bind(*made, r == 0 || size > 0 ? rank : -1, size);
  }
  return r;
}

}  // namespace

extern "C" {
VMMCKPT_EXPORT nccl_result ncclCommInitRank(nccl_comm* comm, int nranks, nccl_unique_id id, int rank);
VMMCKPT_EXPORT nccl_result ncclCommInitRankConfig(nccl_comm* comm, int nranks, nccl_unique_id id, int rank,
                                                  nccl_config* config);
VMMCKPT_EXPORT nccl_result ncclCommInitRankScalable(nccl_comm* comm, int nranks, int rank, int nids,
                                                    nccl_unique_id* ids, nccl_config* config);
VMMCKPT_EXPORT nccl_result ncclCommSplit(nccl_comm comm, int color, int key, nccl_comm* newcomm, nccl_config* config);
VMMCKPT_EXPORT nccl_result ncclCommShrink(nccl_comm comm, int* exclude, int exclude_count, nccl_comm* newcomm,
                                          nccl_config* config, int flags);
VMMCKPT_EXPORT nccl_result ncclAllReduce(const void* send, void* recv, std::size_t count, int type, int reduction,
                                         nccl_comm comm, CUstream stream);
VMMCKPT_EXPORT nccl_result ncclBroadcast(const void* send, void* recv, std::size_t count, int type, int root,
                                         nccl_comm comm, CUstream stream);
VMMCKPT_EXPORT nccl_result ncclBcast(void* buff, std::size_t count, int type, int root, nccl_comm comm,
                                     CUstream stream);
VMMCKPT_EXPORT nccl_result ncclReduce(const void* send, void* recv, std::size_t count, int type, int reduction,
                                      int root, nccl_comm comm, CUstream stream);
VMMCKPT_EXPORT nccl_result ncclAllGather(const void* send, void* recv, std::size_t count, int type, nccl_comm comm,
                                         CUstream stream);
VMMCKPT_EXPORT nccl_result ncclReduceScatter(const void* send, void* recv, std::size_t count, int type, int reduction,
                                             nccl_comm comm, CUstream stream);
VMMCKPT_EXPORT nccl_result ncclAlltoAll(const void* send, void* recv, std::size_t count, int type, nccl_comm comm,
                                        CUstream stream);
VMMCKPT_EXPORT nccl_result ncclGather(const void* send, void* recv, std::size_t count, int type, int root,
                                      nccl_comm comm, CUstream stream);
VMMCKPT_EXPORT nccl_result ncclScatter(const void* send, void* recv, std::size_t count, int type, int root,
                                       nccl_comm comm, CUstream stream);
VMMCKPT_EXPORT nccl_result ncclSend(const void* send, std::size_t count, int type, int peer, nccl_comm comm,
                                    CUstream stream);
VMMCKPT_EXPORT nccl_result ncclRecv(void* recv, std::size_t count, int type, int peer, nccl_comm comm, CUstream stream);
VMMCKPT_EXPORT nccl_result ncclGroupStart();
VMMCKPT_EXPORT nccl_result ncclGroupEnd();
VMMCKPT_EXPORT nccl_result ncclGroupSimulateEnd(nccl_sim_info* info);
}

// ---- communicators --------------------------------------------------------------------------------------------

nccl_result ncclCommInitRank(nccl_comm* comm, int nranks, nccl_unique_id id, int rank) {
  VMMCKPT_REAL(ncclCommInitRank, comm, nranks, id, rank);
  cut::creation created("ncclCommInitRank", cut::id_of_unique_ids(&id, sizeof id), rank, nranks);
  const nccl_result r = real(comm, nranks, id, rank);
  if (issued(r) && comm != nullptr) created.bind(*comm, rank, nranks);
  return r;
}

nccl_result ncclCommInitRankConfig(nccl_comm* comm, int nranks, nccl_unique_id id, int rank, nccl_config* config) {
  VMMCKPT_REAL(ncclCommInitRankConfig, comm, nranks, id, rank, config);
  cut::creation created("ncclCommInitRankConfig", cut::id_of_unique_ids(&id, sizeof id), rank, nranks);
  const nccl_result r = real(comm, nranks, id, rank, config);
  if (issued(r) && comm != nullptr) created.bind(*comm, rank, nranks);
  return r;
}

nccl_result ncclCommInitRankScalable(nccl_comm* comm, int nranks, int rank, int nids, nccl_unique_id* ids,
                                     nccl_config* config) {
  VMMCKPT_REAL(ncclCommInitRankScalable, comm, nranks, rank, nids, ids, config);
  const std::size_t bytes = ids != nullptr && nids > 0 ? sizeof(nccl_unique_id) * static_cast<std::size_t>(nids) : 0;
  cut::creation created("ncclCommInitRankScalable", cut::id_of_unique_ids(ids, bytes), rank, nranks);
  const nccl_result r = real(comm, nranks, rank, nids, ids, config);
  if (issued(r) && comm != nullptr) created.bind(*comm, rank, nranks);
  return r;
}

nccl_result ncclCommSplit(nccl_comm comm, int color, int key, nccl_comm* newcomm, nccl_config* config) {
  VMMCKPT_REAL(ncclCommSplit, comm, color, key, newcomm, config);
  return split_like("ncclCommSplit", comm, color, newcomm, [&] { return real(comm, color, key, newcomm, config); });
}

nccl_result ncclCommShrink(nccl_comm comm, int* exclude, int exclude_count, nccl_comm* newcomm, nccl_config* config,
                           int flags) {
  VMMCKPT_REAL(ncclCommShrink, comm, exclude, exclude_count, newcomm, config, flags);
  return split_like("ncclCommShrink", comm, 0, newcomm,
                    [&] { return real(comm, exclude, exclude_count, newcomm, config, flags); });
}

// ---- operations -----------------------------------------------------------------------------------------------

nccl_result ncclAllReduce(const void* send, void* recv, std::size_t count, int type, int reduction, nccl_comm comm,
                          CUstream stream) {
  VMMCKPT_COLLECTIVE(ncclAllReduce, comm, send, recv, count, type, reduction, comm, stream);
}

nccl_result ncclBroadcast(const void* send, void* recv, std::size_t count, int type, int root, nccl_comm comm,
                          CUstream stream) {
  VMMCKPT_COLLECTIVE(ncclBroadcast, comm, send, recv, count, type, root, comm, stream);
}

nccl_result ncclBcast(void* buff, std::size_t count, int type, int root, nccl_comm comm, CUstream stream) {
  VMMCKPT_COLLECTIVE(ncclBcast, comm, buff, count, type, root, comm, stream);
}

nccl_result ncclReduce(const void* send, void* recv, std::size_t count, int type, int reduction, int root,
                       nccl_comm comm, CUstream stream) {
  VMMCKPT_COLLECTIVE(ncclReduce, comm, send, recv, count, type, reduction, root, comm, stream);
}

nccl_result ncclAllGather(const void* send, void* recv, std::size_t count, int type, nccl_comm comm, CUstream stream) {
  VMMCKPT_COLLECTIVE(ncclAllGather, comm, send, recv, count, type, comm, stream);
}

nccl_result ncclReduceScatter(const void* send, void* recv, std::size_t count, int type, int reduction, nccl_comm comm,
                              CUstream stream) {
  VMMCKPT_COLLECTIVE(ncclReduceScatter, comm, send, recv, count, type, reduction, comm, stream);
}

nccl_result ncclAlltoAll(const void* send, void* recv, std::size_t count, int type, nccl_comm comm, CUstream stream) {
  VMMCKPT_COLLECTIVE(ncclAlltoAll, comm, send, recv, count, type, comm, stream);
}

nccl_result ncclGather(const void* send, void* recv, std::size_t count, int type, int root, nccl_comm comm,
                       CUstream stream) {
  VMMCKPT_COLLECTIVE(ncclGather, comm, send, recv, count, type, root, comm, stream);
}

nccl_result ncclScatter(const void* send, void* recv, std::size_t count, int type, int root, nccl_comm comm,
                        CUstream stream) {
  VMMCKPT_COLLECTIVE(ncclScatter, comm, send, recv, count, type, root, comm, stream);
}

nccl_result ncclSend(const void* send, std::size_t count, int type, int peer, nccl_comm comm, CUstream stream) {
  VMMCKPT_REAL(ncclSend, send, count, type, peer, comm, stream);
  op counted("ncclSend", comm, op::kind::send, peer);
  return real(send, count, type, peer, comm, stream);
}

nccl_result ncclRecv(void* recv, std::size_t count, int type, int peer, nccl_comm comm, CUstream stream) {
  VMMCKPT_REAL(ncclRecv, recv, count, type, peer, comm, stream);
  op counted("ncclRecv", comm, op::kind::recv, peer);
  return real(recv, count, type, peer, comm, stream);
}

nccl_result ncclGroupStart() {
  VMMCKPT_REAL(ncclGroupStart);
  cut::group_start("ncclGroupStart");
  return real();
}

nccl_result ncclGroupEnd() {
  VMMCKPT_REAL(ncclGroupEnd);
  cut::group_end();
  const nccl_result r = real();
  cut::group_returned();
  return r;
}

// Ends the group without launching it: its operations were never issued.
nccl_result ncclGroupSimulateEnd(nccl_sim_info* info) {
  VMMCKPT_REAL(ncclGroupSimulateEnd, info);
  cut::group_end(/*issued=*/false);
  const nccl_result r = real(info);
  cut::group_returned();
  return r;
}
