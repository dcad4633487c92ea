// Streams, events and host functions: work really runs asynchronously and in order on one worker
// thread per stream; the legacy stream (0, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD) is a real
// per-context stream too.
#include "config.hpp"
#include "emu_api.hpp"
#include "state.hpp"

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <unordered_map>

using namespace vmmckpt::emu;

namespace {

using clock_type = std::chrono::steady_clock;

// One cuEventRecord: where in which stream, and when the worker reached it.
struct record_state {
  std::shared_ptr<stream_engine> engine;
  std::uint64_t seq = 0;
  clock_type::time_point at{};  // written by the worker before the task completes
};

struct event {
  unsigned flags = 0;
  std::mutex mutex;
  std::shared_ptr<record_state> last;  // null until first recorded
};

struct event_table {
  std::mutex mutex;
  std::unordered_map<event*, std::unique_ptr<event>> events;
};

event_table& events() {
  static auto* t = new event_table;
  return *t;
}

// The event behind a handle; nullptr for unknown handles. Events are destroyed only through
// cuEventDestroy, so a caller racing with destruction is a user error, as on the real driver.
event* find_event(CUevent handle) {
  auto& t = events();
  std::lock_guard lock(t.mutex);
  auto it = t.events.find(reinterpret_cast<event*>(handle));
  return it == t.events.end() ? nullptr : it->second.get();
}

std::shared_ptr<record_state> last_record(event* e) {
  std::lock_guard lock(e->mutex);
  return e->last;
}

constexpr unsigned valid_event_flags =
    CU_EVENT_DEFAULT | CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;

CUresult create_stream(CUstream* phStream, unsigned flags, int priority) {
  context* ctx = nullptr;
  if (CUresult rc = require_context(ctx); rc != CUDA_SUCCESS) return rc;
  if (phStream == nullptr || (flags & ~static_cast<unsigned>(CU_STREAM_NON_BLOCKING)) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // Priorities outside [-5, 0] are clamped, as documented for the real driver.
  priority = std::min(0, std::max(-5, priority));
  auto engine = std::make_shared<stream_engine>(ctx, flags, priority, false);
  *phStream = register_stream(ctx, std::move(engine));
  return CUDA_SUCCESS;
}

}  // namespace

extern "C" {

CUresult cuStreamCreate(CUstream* phStream, unsigned int Flags) {
  return guarded([&] { return create_stream(phStream, Flags, 0); });
}

CUresult cuStreamCreateWithPriority(CUstream* phStream, unsigned int flags, int priority) {
  return guarded([&] { return create_stream(phStream, flags, priority); });
}

CUresult cuStreamDestroy_v2(CUstream hStream) {
  return guarded([&] {
    if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    if (hStream == nullptr || hStream == CU_STREAM_LEGACY || hStream == CU_STREAM_PER_THREAD) {
      return CUDA_ERROR_INVALID_HANDLE;
    }
    // Returns at once; queued work still completes (the worker drains, then exits).
    return unregister_stream(hStream);
  });
}

CUresult cuStreamSynchronize(CUstream hStream) {
  return guarded([&] {
    std::shared_ptr<stream_engine> s;
    if (CUresult rc = resolve_stream(hStream, s); rc != CUDA_SUCCESS) return rc;
    // Synchronizing the legacy stream waits for what it implicitly follows, too.
    for (auto& w : implicit_waits(s)) w.engine->wait_for(w.seq);
    s->synchronize();
    return CUDA_SUCCESS;
  });
}

CUresult cuStreamQuery(CUstream hStream) {
  return guarded([&] {
    std::shared_ptr<stream_engine> s;
    if (CUresult rc = resolve_stream(hStream, s); rc != CUDA_SUCCESS) return rc;
    return s->idle() ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
  });
}

CUresult cuStreamGetCtx(CUstream hStream, CUcontext* pctx) {
  return guarded([&] {
    std::shared_ptr<stream_engine> s;
    if (CUresult rc = resolve_stream(hStream, s); rc != CUDA_SUCCESS) return rc;
    if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *pctx = to_handle(s->owner());
    return CUDA_SUCCESS;
  });
}

CUresult cuStreamGetCtx_v2(CUstream hStream, CUcontext* pCtx, CUgreenCtx* pGreenCtx) {
  return guarded([&] {
    if (pCtx == nullptr || pGreenCtx == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *pGreenCtx = nullptr;  // no green contexts on the emulator
    return cuStreamGetCtx(hStream, pCtx);
  });
}

CUresult cuStreamGetDevice(CUstream hStream, CUdevice* device) {
  return guarded([&] {
    std::shared_ptr<stream_engine> s;
    if (CUresult rc = resolve_stream(hStream, s); rc != CUDA_SUCCESS) return rc;
    if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *device = s->owner()->device;
    return CUDA_SUCCESS;
  });
}

CUresult cuStreamGetFlags(CUstream hStream, unsigned int* flags) {
  return guarded([&] {
    std::shared_ptr<stream_engine> s;
    if (CUresult rc = resolve_stream(hStream, s); rc != CUDA_SUCCESS) return rc;
    if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *flags = s->flags();
    return CUDA_SUCCESS;
  });
}

CUresult cuStreamGetPriority(CUstream hStream, int* priority) {
  return guarded([&] {
    std::shared_ptr<stream_engine> s;
    if (CUresult rc = resolve_stream(hStream, s); rc != CUDA_SUCCESS) return rc;
    if (priority == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *priority = s->priority();
    return CUDA_SUCCESS;
  });
}

CUresult cuStreamGetId(CUstream hStream, unsigned long long* streamId) {
  return guarded([&] {
    std::shared_ptr<stream_engine> s;
    if (CUresult rc = resolve_stream(hStream, s); rc != CUDA_SUCCESS) return rc;
    if (streamId == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *streamId = reinterpret_cast<std::uintptr_t>(s.get());
    return CUDA_SUCCESS;
  });
}

CUresult cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void* userData) {
  return guarded([&] {
    std::shared_ptr<stream_engine> s;
    if (CUresult rc = resolve_stream(hStream, s); rc != CUDA_SUCCESS) return rc;
    if (fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
    submit(s, [fn, userData] { fn(userData); });
    return CUDA_SUCCESS;
  });
}

CUresult cuStreamAddCallback(CUstream hStream, CUstreamCallback callback, void* userData, unsigned int flags) {
  return guarded([&] {
    std::shared_ptr<stream_engine> s;
    if (CUresult rc = resolve_stream(hStream, s); rc != CUDA_SUCCESS) return rc;
    if (callback == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    // The callback receives the handle it was queued with (0 stays 0), and the stream's status.
    submit(s, [callback, hStream, userData] { callback(hStream, CUDA_SUCCESS, userData); });
    return CUDA_SUCCESS;
  });
}

CUresult cuEventCreate(CUevent* phEvent, unsigned int Flags) {
  return guarded([&] {
    context* ctx = nullptr;
    if (CUresult rc = require_context(ctx); rc != CUDA_SUCCESS) return rc;
    if (phEvent == nullptr || (Flags & ~valid_event_flags) != 0) return CUDA_ERROR_INVALID_VALUE;
    // Interprocess events must disable timing (real rule); IPC itself is not emulated.
    if ((Flags & CU_EVENT_INTERPROCESS) != 0 && (Flags & CU_EVENT_DISABLE_TIMING) == 0) return CUDA_ERROR_INVALID_VALUE;
    auto e = std::make_unique<event>();
    e->flags = Flags;
    event* raw = e.get();
    auto& t = events();
    std::lock_guard lock(t.mutex);
    t.events.emplace(raw, std::move(e));
    *phEvent = reinterpret_cast<CUevent>(raw);
    return CUDA_SUCCESS;
  });
}

CUresult cuEventDestroy_v2(CUevent hEvent) {
  return guarded([&] {
    if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    std::unique_ptr<event> doomed;
    auto& t = events();
    std::lock_guard lock(t.mutex);
    auto it = t.events.find(reinterpret_cast<event*>(hEvent));
    if (it == t.events.end()) return CUDA_ERROR_INVALID_HANDLE;
    // Pending records keep their own state alive (shared_ptr), so destroying now is safe.
    doomed = std::move(it->second);
    t.events.erase(it);
    return CUDA_SUCCESS;
  });
}

CUresult cuEventRecord(CUevent hEvent, CUstream hStream) {
  return guarded([&] {
    if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    event* e = find_event(hEvent);
    if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    std::shared_ptr<stream_engine> s;
    if (CUresult rc = resolve_stream(hStream, s); rc != CUDA_SUCCESS) return rc;
    auto rec = std::make_shared<record_state>();
    rec->engine = s;
    // Publish the record before queuing it so a query right after sees this record.
    std::lock_guard lock(e->mutex);
    rec->seq = submit(s, [rec_raw = rec.get(), keep = rec] { rec_raw->at = clock_type::now(); });
    e->last = std::move(rec);
    return CUDA_SUCCESS;
  });
}

CUresult cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags) {
  if (flags != 0 && flags != CU_EVENT_RECORD_EXTERNAL) return CUDA_ERROR_INVALID_VALUE;
  return cuEventRecord(hEvent, hStream);
}

CUresult cuEventQuery(CUevent hEvent) {
  return guarded([&] {
    if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    event* e = find_event(hEvent);
    if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    auto rec = last_record(e);
    return rec == nullptr || rec->engine->is_done(rec->seq) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
  });
}

CUresult cuEventSynchronize(CUevent hEvent) {
  return guarded([&] {
    if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    event* e = find_event(hEvent);
    if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    if (auto rec = last_record(e)) rec->engine->wait_for(rec->seq);
    return CUDA_SUCCESS;
  });
}

CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags) {
  return guarded([&] {
    std::shared_ptr<stream_engine> s;
    if (CUresult rc = resolve_stream(hStream, s); rc != CUDA_SUCCESS) return rc;
    if (Flags != CU_EVENT_WAIT_DEFAULT && Flags != CU_EVENT_WAIT_EXTERNAL) return CUDA_ERROR_INVALID_VALUE;
    event* e = find_event(hEvent);
    if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    auto rec = last_record(e);
    // Never recorded, or recorded on this same stream: stream order already covers it.
    if (rec == nullptr || rec->engine == s || rec->engine->is_done(rec->seq)) return CUDA_SUCCESS;
    submit(s, [rec] { rec->engine->wait_for(rec->seq); });
    return CUDA_SUCCESS;
  });
}

CUresult cuEventElapsedTime_v2(float* pMilliseconds, CUevent hStart, CUevent hEnd) {
  return guarded([&] {
    if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    if (pMilliseconds == nullptr) return CUDA_ERROR_INVALID_VALUE;
    event* a = find_event(hStart);
    event* b = find_event(hEnd);
    if (a == nullptr || b == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    if (((a->flags | b->flags) & CU_EVENT_DISABLE_TIMING) != 0) return CUDA_ERROR_INVALID_HANDLE;
    auto ra = last_record(a);
    auto rb = last_record(b);
    if (ra == nullptr || rb == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    if (!ra->engine->is_done(ra->seq) || !rb->engine->is_done(rb->seq)) return CUDA_ERROR_NOT_READY;
    *pMilliseconds = std::chrono::duration<float, std::milli>(rb->at - ra->at).count();
    return CUDA_SUCCESS;
  });
}

CUresult cuEventElapsedTime(float* pMilliseconds, CUevent hStart, CUevent hEnd) {
  return cuEventElapsedTime_v2(pMilliseconds, hStart, hEnd);
}

}  // extern "C"

VMMCKPT_EMU_ALIAS(cuStreamSynchronize_ptsz, cuStreamSynchronize)
VMMCKPT_EMU_ALIAS(cuStreamQuery_ptsz, cuStreamQuery)
VMMCKPT_EMU_ALIAS(cuStreamGetCtx_ptsz, cuStreamGetCtx)
VMMCKPT_EMU_ALIAS(cuStreamGetCtx_v2_ptsz, cuStreamGetCtx_v2)
VMMCKPT_EMU_ALIAS(cuStreamGetDevice_ptsz, cuStreamGetDevice)
VMMCKPT_EMU_ALIAS(cuStreamGetFlags_ptsz, cuStreamGetFlags)
VMMCKPT_EMU_ALIAS(cuStreamGetPriority_ptsz, cuStreamGetPriority)
VMMCKPT_EMU_ALIAS(cuStreamGetId_ptsz, cuStreamGetId)
VMMCKPT_EMU_ALIAS(cuLaunchHostFunc_ptsz, cuLaunchHostFunc)
VMMCKPT_EMU_ALIAS(cuStreamAddCallback_ptsz, cuStreamAddCallback)
VMMCKPT_EMU_ALIAS(cuEventRecord_ptsz, cuEventRecord)
VMMCKPT_EMU_ALIAS(cuEventRecordWithFlags_ptsz, cuEventRecordWithFlags)
VMMCKPT_EMU_ALIAS(cuStreamWaitEvent_ptsz, cuStreamWaitEvent)

// The v1 names of these functions have the same ABI; programs linked long ago call them directly.
VMMCKPT_EMU_ALIAS(cuStreamDestroy, cuStreamDestroy_v2)
VMMCKPT_EMU_ALIAS(cuEventDestroy, cuEventDestroy_v2)
