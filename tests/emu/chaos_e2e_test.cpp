// Chaos: rounds of random dumps, suspends, resumes and restores against busy programs, with the tools and the
// programs stopped, continued and killed at random moments and a small file system filling up. After each round
// every program is running with its invariant intact, or dead; none is stuck; every image verify accepts holds
// whole buffers and restores with its bytes; nothing is left that no process owns (docs/reliability.md).
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "e2e_support.hpp"
#include "vmmckpt/protocol/protocol.hpp"

using namespace vmmckpt::test;

namespace {


struct figures {
  std::atomic<int> rounds{0}, operations{0}, tool_kills{0}, tool_stops{0}, program_stops{0}, program_kills{0},
      full_disk_failures{0}, images_checked{0}, restores_checked{0}, suspended_resumed{0}, leftovers_removed{0};
};

class chaos_round {
 public:
  chaos_round(const fs::path& dir, std::uint64_t seed, figures& f, std::vector<std::string>& failures,
              std::mutex& failures_mutex)
      : dir_(dir), rng_(seed), figures_(f), failures_(failures), failures_mutex_(failures_mutex) {}

  void run(int programs, int workers, int actions) {
    for (int i = 0; i < programs; ++i) programs_.push_back(start_writer(600));
    killed_.assign(programs_.size(), false);
    std::vector<std::thread> threads;
    for (int w = 0; w < workers; ++w)
      threads.emplace_back([this, w, actions] {
        std::mt19937_64 rng(seed_for(w));
        for (int a = 0; a < actions; ++a) act(rng, w * 100 + a);
      });
    std::atomic<bool> done{false};
    std::thread monkey([&] { harass_programs(done); });
    for (auto& t : threads) t.join();
    done = true;
    monkey.join();
    settle();
  }

 private:
  std::uint64_t seed_for(int w) {
    std::lock_guard lock(rng_mutex_);
    return rng_() + static_cast<std::uint64_t>(w);
  }

  void fail(const std::string& what) {
    std::lock_guard lock(failures_mutex_);
    failures_.push_back(what);
  }

  // One tool run, signalled at a random moment: killed, or stopped for a while and continued.
  process_result tool(std::mt19937_64& rng, const std::vector<std::string>& argv,
                      const std::map<std::string, std::string>& env = {}) {
    ++figures_.operations;
    background_process p(argv, env);
    const int fate = static_cast<int>(rng() % 10);
    if (fate < 3) {
      usleep(static_cast<useconds_t>(rng() % 1'500'000));
      if (fate == 0) {
        ::kill(p.pid(), SIGKILL);
        ++figures_.tool_kills;
      } else {
        ::kill(p.pid(), SIGSTOP);
        ++figures_.tool_stops;
        usleep(static_cast<useconds_t>(500'000 + rng() % 4'000'000));
        ::kill(p.pid(), SIGCONT);
      }
    }
    // A tool never hangs: every one of its waits has a deadline.
    if (!ends_within(p, 90)) fail("a tool did not end within 90 s: " + argv[1] + "\n" + p.output());
    return result_of(p);
  }

  void act(std::mt19937_64& rng, int id) {
    const std::size_t which = rng() % programs_.size();
    const std::string pid = std::to_string(programs_[which]->pid());
    // Images go to the scratch directory, the default suspend directory, or a small file system that fills up.
    const int where = static_cast<int>(rng() % 3);
    const fs::path base = where == 2 && fs::exists(dir_ / "small") ? dir_ / "small" : dir_;
    const fs::path image = base / ("img-" + std::to_string(id));
    const std::string deadline = std::to_string(2 + rng() % 5);
    switch (rng() % 5) {
      case 0:
      case 1: {
        const auto r = tool(rng, {cuda_ckpt, "dump", pid, "-o", image.string(), "--deadline", deadline});
        if (r.exit_code == 1 && base == dir_ / "small") ++figures_.full_disk_failures;
        break;
      }
      case 2:
      case 3: {
        std::vector<std::string> argv = {cuda_ckpt, "suspend", pid, "--deadline", deadline};
        if (where != 1) argv.insert(argv.end(), {"-o", image.string()});
        tool(rng, argv);
        break;
      }
      default: tool(rng, {cuda_ckpt, "resume", pid}); break;
    }
  }

  // Stops programs for a while and continues them; now and then kills one.
  void harass_programs(const std::atomic<bool>& done) {
    std::mt19937_64 rng(seed_for(1000));
    while (!done) {
      usleep(static_cast<useconds_t>(300'000 + rng() % 1'000'000));
      const std::size_t which = rng() % programs_.size();
      if (killed_[which]) continue;
      if (rng() % 25 == 0) {
        ::kill(programs_[which]->pid(), SIGKILL);
        killed_[which] = true;
        ++figures_.program_kills;
        continue;
      }
      ::kill(programs_[which]->pid(), SIGSTOP);
      ++figures_.program_stops;
      usleep(static_cast<useconds_t>(200'000 + rng() % 3'000'000));
      ::kill(programs_[which]->pid(), SIGCONT);
    }
  }

  // After the round: every program running with whole buffers or dead, every good image restorable,
  // and nothing left behind once gc ran.
  void settle() {
    for (std::size_t i = 0; i < programs_.size(); ++i)
      if (!killed_[i]) ::kill(programs_[i]->pid(), SIGCONT);
    usleep(300'000);
    for (std::size_t i = 0; i < programs_.size(); ++i) {
      if (killed_[i]) continue;
      const std::string pid = std::to_string(programs_[i]->pid());
      if (!programs_[i]->running()) {
        fail("program " + pid + " died, unkilled:\n" + programs_[i]->output());
        continue;
      }
      const auto state = listed_state(programs_[i]->pid());
      if (state.is_null()) {
        fail("program " + pid + " does not answer (stuck)");
        continue;
      }
      if (state.at("state") == "suspended") {
        // A suspended program has its image, and comes back from it.
        const auto r = run_process({cuda_ckpt, "resume", pid}, {}, 120);
        if (r.exit_code != 0) {
          fail("program " + pid + " is suspended and cannot resume (its image lost?): " + describe(r));
          continue;
        }
        ++figures_.suspended_resumed;
      }
      const fs::path check = dir_ / ("check-" + pid);
      const auto d = run_process({cuda_ckpt, "dump", pid, "-o", check.string()}, {}, 120);
      if (d.exit_code != 0) {
        fail("program " + pid + " cannot be dumped after the round: " + describe(d));
        continue;
      }
      if (const auto problem = untorn_problem(check); !problem.empty()) fail("program " + pid + ": " + problem);
      if (run_process({cuda_ckpt, "check", pid}).exit_code != 0) fail("program " + pid + ": pool inconsistent");
    }
    // Every image that verify accepts is whole, and restores with its bytes.
    int restores = 0;
    for (const fs::path& where : {dir_, dir_ / "small", fs::path("/dev/shm/vmmckpt-" + std::to_string(::geteuid()))}) {
      std::error_code ec;
      for (const auto& entry : fs::directory_iterator(where, ec)) {
        const std::string name = entry.path().filename().string();
        if (!entry.is_directory() || name == "small" || name.find(".partial-") != std::string::npos) continue;
        if (where.filename() != "small" && where != dir_ && !ours(name)) continue;
        if (run_process({cuda_ckpt, "verify", entry.path().string()}).exit_code != 0) continue;
        ++figures_.images_checked;
        if (const auto problem = untorn_problem(entry.path()); !problem.empty())
          fail(entry.path().string() + " passes verify but " + problem);
        if (restores < 2) {
          ++restores;
          const auto r = run_process(
              {cuda_ckpt, "restore", entry.path().string(), "--", restored_check, entry.path().string()}, {}, 120);
          if (r.exit_code != 0 || r.out.find("all equal") == std::string::npos)
            fail(entry.path().string() + " passes verify but does not restore: " + describe(r));
          else
            ++figures_.restores_checked;
        }
      }
    }
    for (auto& p : programs_) ::kill(p->pid(), SIGKILL);
    for (auto& p : programs_) p->wait();
    // Nothing is left that no process owns, once gc has removed what the killed tools left.
    const auto gc = run_process({cuda_ckpt, "gc", "--json", dir_.string(), (dir_ / "small").string()});
    const auto gc_default = run_process({cuda_ckpt, "gc", "--json"});
    if (gc.exit_code != 0 || gc_default.exit_code != 0) fail("gc failed: " + describe(gc) + describe(gc_default));
    for (const auto* g : {&gc, &gc_default})
      if (g->exit_code == 0)
        figures_.leftovers_removed += static_cast<int>(nlohmann::json::parse(g->out).at("removed").size());
    for (const fs::path& where : {dir_, dir_ / "small", fs::path("/dev/shm/vmmckpt-" + std::to_string(::geteuid()))}) {
      std::error_code ec;
      for (const auto& entry : fs::directory_iterator(where, ec)) {
        const std::string name = entry.path().filename().string();
        if (where != dir_ && where.filename() != "small" && !ours(name)) continue;
        if (name.find(".partial-") != std::string::npos) fail("left behind: " + entry.path().string());
        for (const char* claim : {"suspend.pending", "suspend.accepted", "suspend.cancelled"})
          if (fs::exists(entry.path() / claim)) fail("left behind: " + entry.path().string() + " (" + claim + ")");
      }
    }
    for (auto& p : programs_)
      if (fs::exists(fs::symlink_status(vmmckpt::protocol::socket_path(p->pid()))))
        fail("left behind: the socket of process " + std::to_string(p->pid()));
  }

  // A default suspend image of one of this round's programs (suspend-PID-TIME).
  bool ours(const std::string& name) const {
    for (const auto& p : programs_)
      if (name.rfind("suspend-" + std::to_string(p->pid()) + "-", 0) == 0) return true;
    return false;
  }

  fs::path dir_;
  std::mt19937_64 rng_;
  std::mutex rng_mutex_;
  figures& figures_;
  std::vector<std::string>& failures_;
  std::mutex& failures_mutex_;
  std::vector<std::unique_ptr<background_process>> programs_;
  std::vector<bool> killed_;
};

}  // namespace

TEST_CASE("chaos: random operations, stops and kills; every program whole or dead, every image good, nothing left",
          "[emu][chaos]") {
  // VMMCKPT_CHAOS_SECONDS runs it longer (docs/reliability.md has the figures of a run of 30 minutes and
  // more); VMMCKPT_CHAOS_SEED repeats one.
  const char* seconds_env = std::getenv("VMMCKPT_CHAOS_SECONDS");
  const char* seed_env = std::getenv("VMMCKPT_CHAOS_SEED");
  const int seconds = seconds_env ? std::atoi(seconds_env) : 30;
  const std::uint64_t seed = seed_env ? std::strtoull(seed_env, nullptr, 0) : std::random_device{}();
  INFO("seed " << seed);
  figures f;
  std::vector<std::string> failures;
  std::mutex failures_mutex;
  const auto stop_at = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  for (std::uint64_t round = 0; std::chrono::steady_clock::now() < stop_at; ++round) {
    scratch_dir dir;
    // A small file system that fills up: a 40 MiB tmpfs where mounting is allowed (root); elsewhere
    // the round goes without it.
    fs::create_directory(dir.path / "small");
    const bool small = ::mount("vmmckpt-chaos", (dir.path / "small").c_str(), "tmpfs", 0, "size=40m,mode=0700") == 0;
    if (!small) fs::remove(dir.path / "small");
    chaos_round(dir.path, seed + round, f, failures, failures_mutex).run(2, 4, 3);
    if (small) ::umount2((dir.path / "small").c_str(), MNT_DETACH);
    ++f.rounds;
  }
  WARN("chaos: seed " << seed << ", " << seconds << " s, " << f.rounds << " rounds, " << f.operations
                      << " operations; faults: " << f.tool_kills << " tools killed, " << f.tool_stops
                      << " tools stopped, " << f.program_stops << " programs stopped, " << f.program_kills
                      << " programs killed, " << f.full_disk_failures << " writes into a full file system; "
                      << f.images_checked << " images verified and checked whole, " << f.restores_checked
                      << " restored and compared, " << f.suspended_resumed << " suspended programs resumed, "
                      << f.leftovers_removed << " leftovers removed by gc; " << failures.size() << " failures");
  for (const auto& failure : failures) FAIL_CHECK(failure);
  REQUIRE(failures.empty());
  REQUIRE(f.rounds > 0);
  REQUIRE(f.images_checked > 0);
}
