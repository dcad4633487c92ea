// Process-wide emulator state: devices, memory accounting, contexts, context stacks, stream handles
// and the implicit ordering rules of the legacy stream.
#include "state.hpp"

#include <pthread.h>

#include "config.hpp"

#include <algorithm>
#include <array>
#include <unordered_map>
#include <unordered_set>

namespace vmmckpt::emu {

namespace {

std::atomic<bool> g_initialized{false};
std::atomic<bool> g_forked_child{false};
std::array<std::atomic<std::uint64_t>, max_devices> g_used{};

// Registries of handles. Heap-allocated and never destroyed: worker threads and late callers
// (atexit handlers of other libraries) may still use them while static destructors run.
struct registries {
  std::mutex mutex;
  std::array<context*, max_devices> primaries{};
  std::unordered_set<context*> user_contexts;
  std::unordered_map<stream_engine*, std::shared_ptr<stream_engine>> streams;
};

registries& regs() {
  static registries* r = new registries;
  return *r;
}

thread_local std::vector<context*> t_stack;

}  // namespace

bool initialized() { return g_initialized.load(std::memory_order_acquire) && !in_forked_child(); }
void mark_initialized() {
  // As the real driver: a child forked after cuInit cannot use CUDA. Every
  // call then answers CUDA_ERROR_NOT_INITIALIZED instead of touching state
  // (and locks) that the parent's other threads held at the fork.
  static const int registered = pthread_atfork(nullptr, nullptr, [] { g_forked_child.store(true); });
  (void)registered;
  g_initialized.store(true, std::memory_order_release);
}
bool in_forked_child() { return g_forked_child.load(std::memory_order_relaxed); }

int device_count() { return settings().device_count; }

bool peer_capable(int dev, int peer) { return dev != peer && settings().peer_to_peer; }

CUresult check_device(CUdevice dev) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (dev < 0 || dev >= device_count()) return CUDA_ERROR_INVALID_DEVICE;
  return CUDA_SUCCESS;
}

bool charge_device_memory(int dev, std::uint64_t bytes) {
  const std::uint64_t total = settings().device_memory;
  auto& used = g_used[static_cast<std::size_t>(dev)];
  std::uint64_t now = used.load();
  do {
    if (bytes > total || now > total - bytes) return false;
  } while (!used.compare_exchange_weak(now, now + bytes));
  return true;
}

void refund_device_memory(int dev, std::uint64_t bytes) { g_used[static_cast<std::size_t>(dev)].fetch_sub(bytes); }

std::uint64_t device_memory_used(int dev) { return g_used[static_cast<std::size_t>(dev)].load(); }

static context* make_context(int dev, bool primary, unsigned flags) {
  static std::atomic<std::uint64_t> next_id{1};
  auto* ctx = new context;
  ctx->id = next_id++;
  ctx->device = dev;
  ctx->primary = primary;
  ctx->flags = flags;
  ctx->legacy = std::make_shared<stream_engine>(ctx, 0U, 0, true);
  return ctx;
}

context* primary_context(int dev) {
  auto& r = regs();
  std::lock_guard lock(r.mutex);
  auto& slot = r.primaries[static_cast<std::size_t>(dev)];
  if (slot == nullptr) slot = make_context(dev, true, 0);
  return slot;
}

context* create_user_context(int dev, unsigned flags) {
  context* ctx = make_context(dev, false, flags);
  ctx->active = true;
  auto& r = regs();
  std::lock_guard lock(r.mutex);
  r.user_contexts.insert(ctx);
  return ctx;
}

void deactivate_context(context* ctx) {
  synchronize_context(ctx);
  {
    auto& r = regs();
    std::lock_guard lock(r.mutex);
    for (auto it = r.streams.begin(); it != r.streams.end();) {
      it = it->second->owner() == ctx ? r.streams.erase(it) : std::next(it);
    }
  }
  std::lock_guard lock(ctx->mutex);
  ctx->active = false;
  for (auto& s : ctx->streams) s->retire();
  ctx->retired.insert(ctx->retired.end(), ctx->streams.begin(), ctx->streams.end());
  ctx->streams.clear();
  ctx->peers.clear();  // a context made anew starts with no peer access, as on the driver
}

void destroy_user_context(context* ctx) {
  {
    auto& r = regs();
    std::lock_guard lock(r.mutex);
    r.user_contexts.erase(ctx);
  }
  deactivate_context(ctx);
  // The context object itself is kept: other threads may still hold it on their stacks, and a
  // stale handle must read as "not live" rather than as freed memory.
}

bool is_live_context(CUcontext handle) {
  if (handle == nullptr) return false;
  auto* ctx = from_handle(handle);
  auto& r = regs();
  {
    std::lock_guard lock(r.mutex);
    const bool known =
        r.user_contexts.contains(ctx) || std::find(r.primaries.begin(), r.primaries.end(), ctx) != r.primaries.end();
    if (!known) return false;
  }
  std::lock_guard lock(ctx->mutex);
  return ctx->active;
}

context* current_context() { return t_stack.empty() ? nullptr : t_stack.back(); }

void set_current_context(context* ctx) {
  if (ctx == nullptr) {
    if (!t_stack.empty()) t_stack.pop_back();
    return;
  }
  if (t_stack.empty()) {
    t_stack.push_back(ctx);
  } else {
    t_stack.back() = ctx;
  }
}

void push_context(context* ctx) { t_stack.push_back(ctx); }

context* pop_context() {
  if (t_stack.empty()) return nullptr;
  context* top = t_stack.back();
  t_stack.pop_back();
  return top;
}

CUresult require_context(context*& out) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  context* ctx = current_context();
  if (ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  {
    std::lock_guard lock(ctx->mutex);
    if (!ctx->active) return CUDA_ERROR_INVALID_CONTEXT;
  }
  out = ctx;
  return CUDA_SUCCESS;
}

CUresult resolve_stream(CUstream handle, std::shared_ptr<stream_engine>& out) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (handle == nullptr || handle == CU_STREAM_LEGACY || handle == CU_STREAM_PER_THREAD) {
    context* ctx = nullptr;
    if (CUresult rc = require_context(ctx); rc != CUDA_SUCCESS) return rc;
    out = ctx->legacy;
    return CUDA_SUCCESS;
  }
  auto& r = regs();
  std::lock_guard lock(r.mutex);
  auto it = r.streams.find(reinterpret_cast<stream_engine*>(handle));
  if (it == r.streams.end()) return CUDA_ERROR_INVALID_HANDLE;
  out = it->second;
  return CUDA_SUCCESS;
}

CUstream register_stream(context* ctx, std::shared_ptr<stream_engine> engine) {
  auto* raw = engine.get();
  {
    std::lock_guard lock(ctx->mutex);
    ctx->streams.push_back(engine);
  }
  auto& r = regs();
  std::lock_guard lock(r.mutex);
  r.streams.emplace(raw, std::move(engine));
  return reinterpret_cast<CUstream>(raw);
}

CUresult unregister_stream(CUstream handle) {
  std::shared_ptr<stream_engine> engine;
  {
    auto& r = regs();
    std::lock_guard lock(r.mutex);
    auto it = r.streams.find(reinterpret_cast<stream_engine*>(handle));
    if (it == r.streams.end()) return CUDA_ERROR_INVALID_HANDLE;
    engine = std::move(it->second);
    r.streams.erase(it);
  }
  context* ctx = engine->owner();
  {
    std::lock_guard lock(ctx->mutex);
    std::erase(ctx->streams, engine);
    ctx->retired.push_back(engine);
  }
  engine->retire();
  return CUDA_SUCCESS;
}

std::vector<wait_point> implicit_waits(const std::shared_ptr<stream_engine>& target) {
  std::vector<wait_point> waits;
  context* ctx = target->owner();
  std::lock_guard lock(ctx->mutex);
  if (target->legacy()) {
    auto add = [&](const std::shared_ptr<stream_engine>& s) {
      if ((s->flags() & CU_STREAM_NON_BLOCKING) == 0 && !s->idle()) waits.push_back({s, s->last_submitted()});
    };
    for (auto& s : ctx->streams) add(s);
    for (auto& s : ctx->retired) add(s);
  } else if ((target->flags() & CU_STREAM_NON_BLOCKING) == 0 && !ctx->legacy->idle()) {
    waits.push_back({ctx->legacy, ctx->legacy->last_submitted()});
  }
  return waits;
}

std::uint64_t submit(const std::shared_ptr<stream_engine>& target, stream_engine::task work) {
  auto waits = implicit_waits(target);
  if (waits.empty()) return target->enqueue(std::move(work));
  return target->enqueue([waits = std::move(waits), work = std::move(work)] {
    for (const auto& w : waits) w.engine->wait_for(w.seq);
    work();
  });
}

void run_ordered_and_wait(const std::shared_ptr<stream_engine>& target, const stream_engine::task& work) {
  if (target->idle() && implicit_waits(target).empty()) {
    work();
    return;
  }
  target->wait_for(submit(target, work));
}

void synchronize_context(context* ctx) {
  std::vector<std::shared_ptr<stream_engine>> all;
  {
    std::lock_guard lock(ctx->mutex);
    all.push_back(ctx->legacy);
    all.insert(all.end(), ctx->streams.begin(), ctx->streams.end());
    all.insert(all.end(), ctx->retired.begin(), ctx->retired.end());
  }
  for (auto& s : all) s->synchronize();
  std::lock_guard lock(ctx->mutex);
  std::erase_if(ctx->retired, [](const std::shared_ptr<stream_engine>& s) { return s->idle(); });
}

void synchronize_all_contexts() {
  std::vector<context*> all;
  {
    auto& r = regs();
    std::lock_guard lock(r.mutex);
    for (context* p : r.primaries) {
      if (p != nullptr) all.push_back(p);
    }
    all.insert(all.end(), r.user_contexts.begin(), r.user_contexts.end());
  }
  for (context* ctx : all) synchronize_context(ctx);
}

}  // namespace vmmckpt::emu
