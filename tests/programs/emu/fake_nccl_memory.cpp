// The stand-in NCCL's shared buffers, made, exported, imported and freed with the calls NCCL makes: ncclCuMemAlloc's
// for the device slot, the SHM transport's cuMem host memory for the flags, the P2P transport's import for a peer's.
#include <unistd.h>

#include <cstring>

#include "fake_nccl_internal.hpp"

namespace fake_nccl {
namespace {

CUmemAllocationProp device_prop(int device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  prop.allocFlags.gpuDirectRDMACapable = 1;
  return prop;
}

CUmemAllocationProp host_prop() {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  prop.location.id = 0;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

// Reserves an address anywhere, maps the handle there and gives this rank's device access; host memory gets the
// CPU's access too (the flags are read and written by host code).
ncclResult_t map_handle(const ncclComm& comm, mapping& m, bool host) {
  FAKE_NCCL_CU(&comm, cuMemAddressReserve(&m.va, m.size, 0, 0, 0));
  FAKE_NCCL_CU(&comm, cuMemMap(m.va, m.size, 0, m.handle, 0));
  m.mapped = true;
  CUmemAccessDesc access[2] = {};
  access[0].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access[0].location.id = comm.device;
  access[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  access[1].location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  access[1].location.id = 0;
  access[1].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  FAKE_NCCL_CU(&comm, cuMemSetAccess(m.va, m.size, access, host ? 2 : 1));
  return ncclSuccess;
}

ncclResult_t import_one(const ncclComm& comm, int fd, mapping& m, bool host) {
  FAKE_NCCL_CU(&comm, cuMemImportFromShareableHandle(&m.handle, reinterpret_cast<void*>(static_cast<std::intptr_t>(fd)),
                                                     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  return map_handle(comm, m, host);
}

// ncclCuMemFree: a reference retained on the address and released, then unmap, release, free the range. Whatever
// fails is said and the rest is still done.
void free_mapping(const ncclComm& comm, mapping& m) {
  auto say = [&](const char* call, CUresult r) {
    if (r != CUDA_SUCCESS) warn(&comm, "%s failed: %s (%d)", call, cuda_error_name(r), static_cast<int>(r));
  };
  if (m.mapped) {
    CUmemGenericAllocationHandle retained = 0;
    const CUresult r = cuMemRetainAllocationHandle(&retained, reinterpret_cast<void*>(m.va));
    say("cuMemRetainAllocationHandle", r);
    if (r == CUDA_SUCCESS) say("cuMemRelease", cuMemRelease(retained));
    say("cuMemUnmap", cuMemUnmap(m.va, m.size));
  }
  if (m.handle != 0) say("cuMemRelease", cuMemRelease(m.handle));
  if (m.va != 0) say("cuMemAddressFree", cuMemAddressFree(m.va, m.size));
  m = mapping{};
}

}  // namespace

ncclResult_t create_own_buffers(ncclComm& comm) {
  peer& me = comm.peers[static_cast<std::size_t>(comm.rank)];
  me.device = comm.device;
  me.pid = getpid();
  const std::size_t wanted = coll_region + static_cast<std::size_t>(comm.nranks) * p2p_region;
  me.slot.size = (wanted + granularity - 1) / granularity * granularity;
  const CUmemAllocationProp device = device_prop(comm.device);
  FAKE_NCCL_CU(&comm, cuMemCreate(&me.slot.handle, me.slot.size, &device, 0));
  FAKE_NCCL_TRY(map_handle(comm, me.slot, false));
  me.flags.size = flags_size;
  const CUmemAllocationProp host = host_prop();
  FAKE_NCCL_CU(&comm, cuMemCreate(&me.flags.handle, me.flags.size, &host, 0));
  FAKE_NCCL_TRY(map_handle(comm, me.flags, true));
  std::memset(reinterpret_cast<void*>(me.flags.va), 0, sizeof(rank_flags));  // every sequence starts at 0
  return ncclSuccess;
}

ncclResult_t export_own_buffers(const ncclComm& comm, int* fds) {
  const peer& me = comm.peers[static_cast<std::size_t>(comm.rank)];
  const CUmemAllocationHandleType posix = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  for (int r = 0; r < 2 * comm.nranks; ++r) fds[r] = -1;
  for (int r = 0; r < comm.nranks; ++r) {
    if (r == comm.rank) continue;
    FAKE_NCCL_CU(&comm, cuMemExportToShareableHandle(&fds[2 * r], me.slot.handle, posix, 0));
    FAKE_NCCL_CU(&comm, cuMemExportToShareableHandle(&fds[2 * r + 1], me.flags.handle, posix, 0));
  }
  return ncclSuccess;
}

ncclResult_t import_peer_buffers(ncclComm& comm, int r, const rank_info& info, const int fds[2]) {
  if (info.rank != r || info.slot_size == 0 || info.slot_size % granularity != 0) {
    warn(&comm, "rank %d sent bad bootstrap information (rank %d, slot of %llu bytes)", r, info.rank,
         static_cast<unsigned long long>(info.slot_size));
    return ncclInternalError;
  }
  peer& p = comm.peers[static_cast<std::size_t>(r)];
  p.device = info.device;
  p.pid = info.pid;
  p.slot.size = info.slot_size;
  FAKE_NCCL_TRY(import_one(comm, fds[0], p.slot, false));
  p.flags.size = flags_size;
  return import_one(comm, fds[1], p.flags, true);
}

void free_peer_buffers(ncclComm& comm) {
  for (int r = 0; r < static_cast<int>(comm.peers.size()); ++r) {
    if (r == comm.rank) continue;
    free_mapping(comm, comm.peers[static_cast<std::size_t>(r)].slot);
    free_mapping(comm, comm.peers[static_cast<std::size_t>(r)].flags);
  }
}

void free_own_buffers(ncclComm& comm) {
  if (comm.peers.empty()) return;
  free_mapping(comm, comm.peers[static_cast<std::size_t>(comm.rank)].slot);
  free_mapping(comm, comm.peers[static_cast<std::size_t>(comm.rank)].flags);
}

}  // namespace fake_nccl
