// The process's per-device pools: created on first use at their fixed addresses.
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstdint>
#include <vector>

#include "vmmckpt/pool/device_pool.hpp"
#include "vmmckpt/restore/upload.hpp"
#include "vmmckpt/support/status.hpp"

namespace vmmckpt::detail {

// False in the child of a fork() after the parent used CUDA: the child cannot
// use the parent's GPU state, so every entry point passes straight through.
bool shim_active();
// For other state that used CUDA (the VMM registry), from its fork handler in the child: the child steps
// aside just as it does when the parent had pools.
void step_aside_in_child();

// The pool of a device ordinal, created on first use; or why not (logged once where it arose).
status acquire_pool(int ordinal, device_pool*& pool);

// The pool whose address range holds addr, if that pool exists.
device_pool* pool_containing(std::uint64_t addr);

// An allocation from device `ordinal`'s pool, as every door into the pool makes it: not while a dump holds
// the program (the gate), logged. The entry points' pool_allocate restores an image first (entry_points.hpp).
status allocate_in_pool(int ordinal, std::size_t size, alloc_api api, CUdeviceptr& out);
// Gives back an allocation nothing else knows of yet (one whose record could not be made).
void free_in_pool(CUdeviceptr addr) noexcept;
// The device of that pool, or -1.
int pool_device_containing(std::uint64_t addr);

// Set once pools of two devices exist: until then no copy can cross devices within pool memory, and
// the copy entry points pay this one relaxed load (peer_access.hpp).
inline std::atomic<bool> several_pools_exist{false};

// Pool memory is accessible from its own device and from the devices granted access to it
// (peer_access.cpp: cuCtxEnablePeerAccess, copies between devices): memory mapped later included,
// and segments mapped again on resume.
// The devices besides `ordinal` whose access to its pool is complete (bit d: device d).
std::uint32_t pool_peers(int ordinal);
// Gives `device` access to the pool of `owner`, now or whenever that pool comes to exist; the caller
// knows the pair can access each other. Access once given stays.
status grant_pool_access(int owner, int device);

// Bytes the program could still allocate from pools of this device without
// new physical memory (backed but not live): added to the driver's free figure.
std::uint64_t reusable_pool_bytes(int ordinal);

struct active_pool {
  int ordinal;
  device_pool* pool;
};
// Every pool created so far, by device ordinal.
std::vector<active_pool> active_pools();

// Whether [addr, addr + size) of a device has physical memory under it, in the pools as they stand
// when this is called: for an upload, during which nothing maps or unmaps.
restore::backed_memory pool_memory_backed();

// The CUDA error a pool_status stands for, at the exported edge.
CUresult to_cuda_result(pool_status status, int backend_error);

}  // namespace vmmckpt::detail
