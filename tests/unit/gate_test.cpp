// The shim's work gate (shim/src/core/gate.cpp): closing holds new calls, waits for calls inside, gives up
// at its deadline; the count of returned work survives threads that exit and threads beyond the slots;
// a child of fork() can still close it.
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include "core/gate.hpp"

using vmmckpt::detail::gate_scope;
using vmmckpt::detail::the_gate;
using namespace std::chrono_literals;

namespace {

auto in(std::chrono::milliseconds ms) { return std::chrono::steady_clock::now() + ms; }

// A thread that sits inside a gated call until let go.
class caller_inside {
 public:
  explicit caller_inside(gate_scope::kind k = gate_scope::submits_work)
      : thread_([this, k] {
          gate_scope scope(k);
          {
            gate_scope nested(gate_scope::no_work);  // nested calls do not count again
          }
          inside_ = true;
          std::unique_lock lock(mu_);
          cv_.wait(lock, [this] { return go_; });
        }) {
    while (!inside_) std::this_thread::yield();
  }
  void let_go() {
    {
      std::lock_guard lock(mu_);
      go_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  ~caller_inside() { let_go(); }

 private:
  std::atomic<bool> inside_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  bool go_ = false;
  std::thread thread_;
};

}  // namespace

TEST_CASE("closing the gate waits for the call inside, then holds new calls until it opens", "[gate]") {
  caller_inside caller;
  std::atomic<bool> closed{false};
  std::thread closer([&] { closed = the_gate().close(in(10s)); });
  std::this_thread::sleep_for(50ms);
  CHECK_FALSE(closed);  // the call is still inside
  caller.let_go();
  closer.join();
  REQUIRE(closed);
  REQUIRE(the_gate().is_closed());

  std::atomic<bool> passed{false};
  std::thread late([&] {
    gate_scope scope;
    passed = true;
  });
  std::this_thread::sleep_for(50ms);
  CHECK_FALSE(passed);  // held at the door
  the_gate().open();
  late.join();
  CHECK(passed);
}

TEST_CASE("a close that meets its deadline gives up and leaves the gate open", "[gate]") {
  caller_inside caller(gate_scope::no_work);
  CHECK_FALSE(the_gate().close(in(30ms)));
  CHECK_FALSE(the_gate().is_closed());
  std::thread other([] { gate_scope scope; });  // not held
  other.join();
  caller.let_go();
  REQUIRE(the_gate().close(in(10s)));
  the_gate().open();
}

TEST_CASE("the work count takes every returned work call, from threads beyond the slots and after they exit",
          "[gate]") {
  constexpr int threads = vmmckpt::detail::work_gate::slot_count + 44;  // some share the last slot
  constexpr int calls = 20;
  const std::uint64_t before = the_gate().submitted();
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&] {
      for (int c = 0; c < calls; ++c) {
        gate_scope work;
        gate_scope nested(gate_scope::no_work);
      }
      { gate_scope not_work(gate_scope::no_work); }
      // All alive at once, so that every slot is taken before any is given back.
      std::unique_lock lock(mu);
      if (++arrived == threads) cv.notify_all();
      cv.wait(lock, [&] { return arrived == threads; });
    });
  for (auto& t : pool) t.join();
  const std::uint64_t after = the_gate().submitted();
  CHECK(after - before == std::uint64_t{threads} * calls);

  // Slots given back at exit are taken again; the count goes on from where it stood.
  std::thread again([] { gate_scope work; });
  again.join();
  CHECK(the_gate().submitted() == after + 1);
  REQUIRE(the_gate().close(in(10s)));  // no slot was left marked inside
  the_gate().open();
}

TEST_CASE("while the gate is closed no call runs, however busy the callers", "[gate]") {
  constexpr int threads = 6;
  std::atomic<bool> stop{false};
  std::vector<std::atomic<std::uint64_t>> progress(threads);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      while (!stop.load(std::memory_order_relaxed)) {
        gate_scope scope(t % 2 ? gate_scope::submits_work : gate_scope::no_work);
        progress[t].fetch_add(1, std::memory_order_relaxed);  // work done only inside the gate
      }
    });
  std::uint64_t total = 0;
  for (int round = 0; round < 100; ++round) {
    REQUIRE(the_gate().close(in(10s)));
    std::vector<std::uint64_t> seen;
    for (auto& p : progress) seen.push_back(p.load());
    std::this_thread::sleep_for(200us);
    for (int t = 0; t < threads; ++t) REQUIRE(progress[t].load() == seen[t]);
    the_gate().open();
    std::this_thread::sleep_for(100us);
  }
  stop = true;
  the_gate().open();
  for (auto& t : pool) t.join();
  for (auto& p : progress) total += p.load();
  CHECK(total > 0);
}

TEST_CASE("in a child of fork() the gate closes though another thread was inside at the fork", "[gate]") {
  caller_inside caller;
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // Only this thread exists here; the caller's slot must not hold the gate open for good.
    const bool closed = the_gate().close(in(2s));
    the_gate().open();
    { gate_scope scope; }
    _exit(closed ? 0 : 1);
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}
