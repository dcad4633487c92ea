// Process-wide emulator state: initialisation, devices and their memory accounting, contexts, the
// thread-local context stack, and the lookup of stream handles.
#pragma once

#include "emu_api.hpp"
#include "stream_engine.hpp"

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace vmmckpt::emu {

struct context {
  int device = 0;
  bool primary = false;
  unsigned flags = 0;
  // Guarded by mutex below. A primary context is active while retained; user contexts always are.
  bool active = false;
  int primary_refs = 0;
  unsigned primary_flags = 0;

  std::mutex mutex;
  std::uint64_t id = 0;
  std::size_t limits[CU_LIMIT_MAX] = {1024, 1 << 20, 8 << 20, 2, 2048, 64, 0, 0, 0, 0};
  CUfunc_cache cache_config = CU_FUNC_CACHE_PREFER_NONE;
  std::shared_ptr<stream_engine> legacy;                // created with the context, thread on first use
  std::vector<std::shared_ptr<stream_engine>> streams;  // user streams with a live handle
  std::vector<std::shared_ptr<stream_engine>> retired;  // destroyed streams that may still be draining
  std::vector<context*> peers;  // contexts this one has enabled peer access to (cuCtxEnablePeerAccess)
};

bool initialized();
void mark_initialized();
// True in a child forked after cuInit: every entry point refuses, as the real driver does.
bool in_forked_child();

// CUDA_ERROR_NOT_INITIALIZED before cuInit, CUDA_ERROR_INVALID_DEVICE for a bad ordinal.
CUresult check_device(CUdevice dev);
int device_count();
// What cuDeviceCanAccessPeer answers: distinct devices, unless VMMCKPT_EMU_NO_P2P.
bool peer_capable(int dev, int peer);

// Per-process accounting of device memory (VMMCKPT_EMU_MEM per device).
bool charge_device_memory(int dev, std::uint64_t bytes);
void refund_device_memory(int dev, std::uint64_t bytes);
std::uint64_t device_memory_used(int dev);

// The primary context of a device: one object per device for the life of the process, so its handle
// is stable across release/retain like the real driver's.
context* primary_context(int dev);
context* create_user_context(int dev, unsigned flags);
void destroy_user_context(context* ctx);
// Waits for the context's work, invalidates its stream handles and marks it inactive (primary
// context release to zero, reset, or user context destruction).
void deactivate_context(context* ctx);
// True for a handle that names a live context (active primary or not-destroyed user context).
bool is_live_context(CUcontext handle);
inline context* from_handle(CUcontext handle) { return reinterpret_cast<context*>(handle); }
inline CUcontext to_handle(context* ctx) { return reinterpret_cast<CUcontext>(ctx); }

// The calling thread's context stack (top is current).
context* current_context();
void set_current_context(context* ctx);
void push_context(context* ctx);
context* pop_context();

// NOT_INITIALIZED / INVALID_CONTEXT / SUCCESS with the current (live) context in `out`.
CUresult require_context(context*& out);

// Streams: resolves a CUstream (0, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD or a created stream).
// Special handles need a current context; their engine is that context's legacy stream.
CUresult resolve_stream(CUstream handle, std::shared_ptr<stream_engine>& out);
CUstream register_stream(context* ctx, std::shared_ptr<stream_engine> engine);
// Removes the handle; the engine keeps draining its queue (retired) and is waited for by
// cuCtxSynchronize until idle.
CUresult unregister_stream(CUstream handle);

// Legacy-stream semantics: work on the legacy stream waits for prior work of every blocking stream
// of its context, and work on a blocking stream waits for prior legacy work. Returns the engines
// and sequence numbers the new work must wait for.
struct wait_point {
  std::shared_ptr<stream_engine> engine;
  std::uint64_t seq;
};
std::vector<wait_point> implicit_waits(const std::shared_ptr<stream_engine>& target);

// Queues `work` on `target` after its implicit waits. Returns the task's sequence number.
std::uint64_t submit(const std::shared_ptr<stream_engine>& target, stream_engine::task work);
// Runs `work` in order on `target` and waits for it: inline on the calling thread when nothing it
// must follow is pending (so simple synchronous programs never start a thread), otherwise queued.
void run_ordered_and_wait(const std::shared_ptr<stream_engine>& target, const stream_engine::task& work);

// Waits for every stream of the context (legacy, user, and retired ones still draining).
void synchronize_context(context* ctx);
// Waits for every stream of every context (native frees use this: freed memory must not be
// touched by queued work).
void synchronize_all_contexts();

}  // namespace vmmckpt::emu
