// Shared by fill.cu (real GPU, kernels) and emu_fill.cpp (driver API only, runs on the emulated
// driver): the fill pattern, the pointer file, the command line and the stdin protocol.
#pragma once

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.hpp"

#ifdef __CUDACC__
#define BENCH_HD __host__ __device__
#else
#define BENCH_HD
#endif

namespace bench {

// 64-bit word k of piece p: a hash (splitmix64's finalizer), so a page copied to the wrong place,
// a stale page or a zeroed one cannot pass.
// What stdin's "flip PERCENT" XORs into the first PERCENT % of each piece's words (a second flip undoes
// it): the changed blocks of an incremental dump (bench/run_bench.py's incremental part).
constexpr std::uint64_t flip_mask = 0xa5a5a5a5a5a5a5a5ULL;

BENCH_HD inline std::uint64_t fill_word(std::uint64_t piece, std::uint64_t k) {
  std::uint64_t x = (piece << 48) ^ k ^ 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

struct piece {
  std::uint64_t addr = 0;
  std::uint64_t size = 0;
};

struct fill_options {
  std::uint64_t bytes = 1ULL << 30;
  std::uint64_t piece_bytes = 1ULL << 30;
  std::string pointers;  // written after filling, or (verify_only) read
  bool verify_only = false;
  // Instead of reading stdin: run until this file exists, then check every piece and exit (a program
  // with no pipe to its starter, which CRIU dumps and restores whole: bench/run_bench.py's process case).
  std::string until;
  // Each tick (every 10 ms) rewrites this share of every piece with the pattern XOR the tick's number: a
  // program whose memory keeps changing between the passes of a pre-copy (run_bench.py's process case).
  int churn_percent = 0;
};

// --gib N | --mib N, --piece-mib M | --piece-bytes B (many small allocations), --pointers FILE | --verify-pointers FILE
inline fill_options parse_fill_options(int argc, char** argv) {
  fill_options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(argv[0], a + " needs a value");
      return argv[++i];
    };
    if (a == "--gib")
      o.bytes = static_cast<std::uint64_t>(std::strtod(value().c_str(), nullptr) * (1ULL << 30));
    else if (a == "--mib")
      o.bytes = std::strtoull(value().c_str(), nullptr, 0) << 20;
    else if (a == "--piece-mib")
      o.piece_bytes = std::strtoull(value().c_str(), nullptr, 0) << 20;
    else if (a == "--piece-bytes")
      o.piece_bytes = std::strtoull(value().c_str(), nullptr, 0);
    else if (a == "--pointers")
      o.pointers = value();
    else if (a == "--until")
      o.until = value();
    else if (a == "--churn")
      o.churn_percent = std::atoi(value().c_str());
    else if (a == "--verify-pointers") {
      o.pointers = value();
      o.verify_only = true;
    } else
      usage_error(argv[0], "unknown option " + a);
  }
  if (o.pointers.empty()) usage_error(argv[0], "--pointers FILE or --verify-pointers FILE is required");
  if (o.bytes == 0 || o.piece_bytes == 0 || o.bytes % 8 != 0 || o.piece_bytes % 8 != 0)
    usage_error(argv[0], "sizes must be positive multiples of 8 bytes");
  if (o.churn_percent < 0 || o.churn_percent > 100 || (o.churn_percent > 0 && o.until.empty()))
    usage_error(argv[0], "--churn takes 0 to 100, with --until (the check then runs after the last tick)");
  return o;
}

// The pieces a fill of o.bytes makes: o.piece_bytes each, the last one what remains.
inline std::vector<piece> plan_pieces(const fill_options& o) {
  std::vector<piece> out;
  for (std::uint64_t done = 0; done < o.bytes; done += o.piece_bytes)
    out.push_back({0, std::min(o.piece_bytes, o.bytes - done)});
  return out;
}

inline void write_pointers(const std::string& path, const std::vector<piece>& pieces) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    std::perror(path.c_str());
    std::exit(1);
  }
  for (const piece& p : pieces)
    std::fprintf(f, "0x%llx %llu\n", static_cast<unsigned long long>(p.addr), static_cast<unsigned long long>(p.size));
  if (std::fclose(f) != 0) {
    std::perror(path.c_str());
    std::exit(1);
  }
}

// The piece number is the line number: it is part of the pattern.
inline std::vector<piece> read_pointers(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "cannot read %s\n", path.c_str());
    std::exit(1);
  }
  std::vector<piece> out;
  std::string addr;
  unsigned long long size = 0;
  while (in >> addr >> size) out.push_back({std::strtoull(addr.c_str(), nullptr, 16), size});
  if (out.empty()) {
    std::fprintf(stderr, "%s lists no pieces\n", path.c_str());
    std::exit(1);
  }
  return out;
}

inline bool report_check(std::uint64_t mismatches) {
  if (mismatches == 0)
    std::printf("check ok\n");
  else
    std::printf("check FAILED %llu\n", static_cast<unsigned long long>(mismatches));
  std::fflush(stdout);
  return mismatches == 0;
}

// Prints "ready", then keeps the program a live GPU program (tick() every 10 ms on a thread of its
// own) until stdin closes; each line "check" runs count_mismatches() and prints the verdict.
// stdin's lines: "check" (every piece against its pattern: "check ok" or "check FAILED n") and, where
// `flip` is given, "flip PERCENT" (then "flipped").
inline int serve(const std::function<void()>& tick, const std::function<std::uint64_t()>& count_mismatches,
                 const std::string& until = {}, const std::function<void(int)>& flip = {}) {
  std::printf("ready\n");
  std::fflush(stdout);
  std::atomic<bool> stop{false};
  std::thread ticker([&] {
    while (!stop.load()) {
      tick();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  if (!until.empty()) {
    while (::access(until.c_str(), F_OK) != 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    stop = true;
    ticker.join();  // its last tick's writes are the ones checked
    return report_check(count_mismatches()) ? 0 : 1;
  }
  for (std::string line; std::getline(std::cin, line);) {
    if (line == "check") report_check(count_mismatches());
    if (flip && line.rfind("flip ", 0) == 0) {
      flip(std::atoi(line.c_str() + 5));
      std::printf("flipped\n");
      std::fflush(stdout);
    }
  }
  stop = true;
  ticker.join();
  return 0;
}

}  // namespace bench
