// Tests of streams, events and host functions: work runs asynchronously, in order, on worker
// threads, and the legacy stream orders itself with blocking streams like the real driver's.
#include "emu_test_support.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

using namespace emu_test;
using namespace std::chrono_literals;

namespace {

// A gate a host function waits on, so a test can hold a stream busy.
struct gate {
  std::mutex m;
  std::condition_variable cv;
  bool open = false;
  std::atomic<bool> entered{false};

  static void wait_fn(void* self) {
    auto* g = static_cast<gate*>(self);
    g->entered = true;
    std::unique_lock lock(g->m);
    g->cv.wait(lock, [&] { return g->open; });
  }
  void release() {
    {
      std::lock_guard lock(m);
      open = true;
    }
    cv.notify_all();
  }
};

struct order_log {
  std::mutex m;
  std::vector<int> seen;
  std::thread::id thread;
};

struct step {
  order_log* log;
  int value;
  static void fn(void* self) {
    auto* s = static_cast<step*>(self);
    std::lock_guard lock(s->log->m);
    s->log->seen.push_back(s->value);
    s->log->thread = std::this_thread::get_id();
  }
};

void set_flag(void* flag) { static_cast<std::atomic<int>*>(flag)->store(1); }

}  // namespace

TEST_CASE("stream work runs asynchronously and in order", "[streams]") {
  current_context();
  CUstream s = nullptr;
  REQUIRE_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  REQUIRE_CU(cuStreamQuery(s));

  gate g;
  order_log log;
  std::vector<step> steps;
  for (int i = 0; i < 50; ++i) steps.push_back({&log, i});
  REQUIRE_CU(cuLaunchHostFunc(s, &gate::wait_fn, &g));
  for (auto& st : steps) REQUIRE_CU(cuLaunchHostFunc(s, &step::fn, &st));

  // Pinned memory keeps async copies asynchronous: the copy waits behind the gate too.
  char* host = nullptr;
  REQUIRE_CU(cuMemAllocHost(reinterpret_cast<void**>(&host), 64));
  host[0] = 'x';
  CUdeviceptr dev = 0;
  REQUIRE_CU(cuMemAlloc(&dev, 64));
  REQUIRE_CU(cuMemsetD8(dev, 0, 64));
  REQUIRE_CU(cuMemcpyHtoDAsync(dev, host, 1, s));

  std::this_thread::sleep_for(20ms);
  REQUIRE(cuStreamQuery(s) == CUDA_ERROR_NOT_READY);
  REQUIRE(g.entered.load());
  {
    std::lock_guard lock(log.m);
    REQUIRE(log.seen.empty());
  }
  REQUIRE(*reinterpret_cast<volatile char*>(dev) == 0);

  g.release();
  REQUIRE_CU(cuStreamSynchronize(s));
  REQUIRE_CU(cuStreamQuery(s));
  REQUIRE(log.seen.size() == 50);
  for (int i = 0; i < 50; ++i) REQUIRE(log.seen[static_cast<std::size_t>(i)] == i);
  REQUIRE(log.thread != std::this_thread::get_id());
  REQUIRE(*reinterpret_cast<volatile char*>(dev) == 'x');

  CUcontext owner = nullptr;
  REQUIRE_CU(cuStreamGetCtx(s, &owner));
  REQUIRE(owner == current_context());
  CUdevice sdev = -1;
  REQUIRE_CU(cuStreamGetDevice(s, &sdev));
  REQUIRE(sdev == 0);
  REQUIRE_CU(cuStreamDestroy(s));
  REQUIRE(cuStreamQuery(s) == CUDA_ERROR_INVALID_HANDLE);
  REQUIRE_CU(cuMemFree(dev));
  REQUIRE_CU(cuMemFreeHost(host));
}

TEST_CASE("async copies from pageable memory complete before returning", "[streams]") {
  current_context();
  CUstream s = nullptr;
  REQUIRE_CU(cuStreamCreate(&s, 0));
  CUdeviceptr dev = 0;
  REQUIRE_CU(cuMemAlloc(&dev, 16));
  std::vector<char> pageable(16, 'p');
  REQUIRE_CU(cuMemcpyHtoDAsync(dev, pageable.data(), 16, s));
  pageable.assign(16, 'q');  // the real driver has staged the source by now
  std::vector<char> back(16, 0);
  REQUIRE_CU(cuMemcpyDtoHAsync(back.data(), dev, 16, s));
  REQUIRE(back[15] == 'p');  // device-to-pageable returns only once done
  REQUIRE_CU(cuStreamDestroy(s));
  REQUIRE_CU(cuMemFree(dev));
}

TEST_CASE("destroying a stream with pending work completes the work", "[streams]") {
  current_context();
  CUstream s = nullptr;
  REQUIRE_CU(cuStreamCreateWithPriority(&s, 0, -3));
  int prio = 0;
  REQUIRE_CU(cuStreamGetPriority(s, &prio));
  REQUIRE(prio == -3);
  gate g;
  std::atomic<int> done{0};
  REQUIRE_CU(cuLaunchHostFunc(s, &gate::wait_fn, &g));
  REQUIRE_CU(cuLaunchHostFunc(s, &set_flag, &done));
  REQUIRE_CU(cuStreamDestroy(s));  // returns at once, like the real driver
  REQUIRE(done.load() == 0);
  g.release();
  REQUIRE_CU(cuCtxSynchronize());  // waits for the destroyed stream's work too
  REQUIRE(done.load() == 1);
}

TEST_CASE("events track stream progress and time", "[streams][events]") {
  current_context();
  CUstream s = nullptr;
  REQUIRE_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUevent start = nullptr, stop = nullptr, never = nullptr, untimed = nullptr;
  REQUIRE_CU(cuEventCreate(&start, CU_EVENT_DEFAULT));
  REQUIRE_CU(cuEventCreate(&stop, CU_EVENT_BLOCKING_SYNC));
  REQUIRE_CU(cuEventCreate(&never, CU_EVENT_DEFAULT));
  REQUIRE_CU(cuEventCreate(&untimed, CU_EVENT_DISABLE_TIMING));
  REQUIRE_CU(cuEventQuery(never));  // never recorded: complete

  gate g;
  REQUIRE_CU(cuEventRecord(start, s));
  REQUIRE_CU(cuLaunchHostFunc(s, &gate::wait_fn, &g));
  REQUIRE_CU(cuEventRecord(stop, s));
  REQUIRE_CU(cuEventRecord(untimed, s));
  std::this_thread::sleep_for(30ms);
  REQUIRE(cuEventQuery(stop) == CUDA_ERROR_NOT_READY);
  float ms = 0;
  REQUIRE(cuEventElapsedTime(&ms, start, stop) == CUDA_ERROR_NOT_READY);

  // Another stream waiting on the event does not run past it.
  CUstream waiter = nullptr;
  REQUIRE_CU(cuStreamCreate(&waiter, CU_STREAM_NON_BLOCKING));
  std::atomic<int> after{0};
  REQUIRE_CU(cuStreamWaitEvent(waiter, stop, 0));
  REQUIRE_CU(cuLaunchHostFunc(waiter, &set_flag, &after));
  std::this_thread::sleep_for(20ms);
  REQUIRE(after.load() == 0);
  REQUIRE(cuStreamQuery(waiter) == CUDA_ERROR_NOT_READY);

  g.release();
  REQUIRE_CU(cuEventSynchronize(stop));
  REQUIRE_CU(cuEventQuery(stop));
  REQUIRE_CU(cuEventElapsedTime(&ms, start, stop));
  REQUIRE(ms >= 40.0f);
  REQUIRE(cuEventElapsedTime(&ms, start, untimed) == CUDA_ERROR_INVALID_HANDLE);
  REQUIRE(cuEventElapsedTime(&ms, start, never) == CUDA_ERROR_INVALID_HANDLE);
  REQUIRE_CU(cuStreamSynchronize(waiter));
  REQUIRE(after.load() == 1);

  for (CUevent e : {start, stop, never, untimed}) REQUIRE_CU(cuEventDestroy(e));
  REQUIRE(cuEventQuery(start) == CUDA_ERROR_INVALID_HANDLE);
  REQUIRE_CU(cuStreamDestroy(waiter));
  REQUIRE_CU(cuStreamDestroy(s));
}

TEST_CASE("the legacy stream waits for blocking streams but not for non-blocking ones", "[streams][legacy]") {
  current_context();
  CUstream blocking = nullptr, non_blocking = nullptr;
  REQUIRE_CU(cuStreamCreate(&blocking, CU_STREAM_DEFAULT));
  REQUIRE_CU(cuStreamCreate(&non_blocking, CU_STREAM_NON_BLOCKING));
  std::atomic<int> legacy_ran{0};
  gate g;  // outlives the sections: the worker may still be returning from it

  SECTION("behind a busy non-blocking stream, legacy work runs") {
    REQUIRE_CU(cuLaunchHostFunc(non_blocking, &gate::wait_fn, &g));
    REQUIRE_CU(cuLaunchHostFunc(CU_STREAM_LEGACY, &set_flag, &legacy_ran));
    REQUIRE_CU(cuStreamSynchronize(nullptr));
    REQUIRE(legacy_ran.load() == 1);
    REQUIRE(cuStreamQuery(non_blocking) == CUDA_ERROR_NOT_READY);
    g.release();
  }
  SECTION("behind a busy blocking stream, legacy work and synchronous copies wait") {
    REQUIRE_CU(cuLaunchHostFunc(blocking, &gate::wait_fn, &g));
    REQUIRE_CU(cuLaunchHostFunc(nullptr, &set_flag, &legacy_ran));
    std::this_thread::sleep_for(20ms);
    REQUIRE(legacy_ran.load() == 0);
    REQUIRE(cuStreamQuery(nullptr) == CUDA_ERROR_NOT_READY);

    CUdeviceptr dev = 0;
    REQUIRE_CU(cuMemAlloc(&dev, 8));
    std::atomic<bool> copied{false};
    CUresult copy_rc = CUDA_ERROR_UNKNOWN;
    std::thread copier([&] {
      if (!make_context_current_quietly()) return;
      char v = 'z';
      copy_rc = cuMemcpyHtoD(dev, &v, 1);
      copied = true;
    });
    std::this_thread::sleep_for(20ms);
    REQUIRE_FALSE(copied.load());
    g.release();
    copier.join();
    REQUIRE(copied.load());
    REQUIRE(copy_rc == CUDA_SUCCESS);
    REQUIRE(*reinterpret_cast<volatile char*>(dev) == 'z');
    REQUIRE(legacy_ran.load() == 1);
    REQUIRE_CU(cuMemFree(dev));
  }
  REQUIRE_CU(cuCtxSynchronize());
  REQUIRE_CU(cuStreamDestroy(blocking));
  REQUIRE_CU(cuStreamDestroy(non_blocking));
}

TEST_CASE("stream-ordered allocation frees in stream order", "[streams]") {
  current_context();
  CUstream s = nullptr;
  REQUIRE_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUdeviceptr p = 0;
  REQUIRE_CU(cuMemAllocAsync(&p, 1 << 20, s));
  REQUIRE_CU(cuMemsetD32Async(p, 7, 16, s));
  gate g;
  REQUIRE_CU(cuLaunchHostFunc(s, &gate::wait_fn, &g));
  REQUIRE_CU(cuMemFreeAsync(p, s));
  std::this_thread::sleep_for(10ms);
  CUdeviceptr base = 0;
  std::size_t size = 0;
  REQUIRE_CU(cuMemGetAddressRange(&base, &size, p));  // not freed yet: the stream is held
  g.release();
  REQUIRE_CU(cuStreamSynchronize(s));
  REQUIRE(cuMemGetAddressRange(&base, &size, p) == CUDA_ERROR_NOT_FOUND);
  REQUIRE_CU(cuStreamDestroy(s));
}
