// What the end-to-end tests share: paths of the tools under test, scratch directories, the busy writer and its invariant.
#pragma once

#include <catch2/catch.hpp>

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "contracts/busy_pattern.hpp"
#include "process.hpp"
#include "skip.hpp"
#include "vmmckpt/image/image.hpp"

namespace vmmckpt::test {

namespace fs = std::filesystem;

inline const std::string build_dir = VMMCKPT_BUILD_DIR;
inline const std::string cuda_ckpt = build_dir + "/bin/cuda-ckpt";
inline const std::string programs = build_dir + "/tests/programs/";
inline const std::string shim = build_dir + "/lib/libvmmckpt.so";
inline const std::string writer_program = programs + "emu_busy_writer";
inline const std::string restored_check = programs + "emu_restored_bytes_check";
inline constexpr std::size_t writer_buffer_size = 1 << 20;  // emu_busy_writer's default
inline constexpr std::size_t writer_buffers = 8;

// A file's bytes, all of them; empty when it cannot be read.
inline std::string file_text(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// An address as the tools print it: 0x and lower-case hex digits.
inline std::string hex(std::uint64_t v) {
  char text[24];
  std::snprintf(text, sizeof text, "0x%llx", static_cast<unsigned long long>(v));
  return text;
}

inline std::string describe(const process_result& r) {
  return "exit " + std::to_string(r.exit_code) + " signal " + std::to_string(r.signal) + "\nstdout:\n" + r.out +
         "\nstderr:\n" + r.err;
}

// A background tool given at most `seconds` to end (polled every 0.1 s); false, with it killed, when it did not.
inline bool ends_within(background_process& p, int seconds) {
  for (int i = 0; i < seconds * 10 && p.running(); ++i) usleep(100'000);
  if (!p.running()) return true;
  ::kill(p.pid(), SIGKILL);
  return false;
}

// How a background tool ended (wait()'s 128 + N for a signal N): its exit code or signal, and what it printed.
inline process_result result_of(background_process& p) {
  process_result r;
  const int status = p.wait();
  r.exit_code = status < 128 ? status : -1;
  r.signal = status >= 128 ? status - 128 : 0;
  r.out = p.output();
  return r;
}

// A fresh directory under /tmp, removed with everything in it.
struct scratch_dir {
  fs::path path;
  scratch_dir() {
    char pattern[] = "/tmp/vmmckpt-test-XXXXXX";
    REQUIRE(mkdtemp(pattern) != nullptr);
    path = pattern;
  }
  ~scratch_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// emu_busy_writer under the shim, streams rewriting its buffers until killed.
inline std::unique_ptr<background_process> start_writer(int seconds = 120) {
  auto p = std::make_unique<background_process>(
      std::vector<std::string>{cuda_ckpt, "run", "--", writer_program, "--seconds", std::to_string(seconds)});
  REQUIRE(p->wait_for_output("ready\n"));
  return p;
}

// Every writer buffer in the image holds one whole generation of its pattern
// (contracts/busy_pattern.hpp); a torn copy breaks it. Returns what is wrong, or
// an empty string; safe to call from any thread (no Catch2 assertions).
inline std::string untorn_problem(const fs::path& image_dir) {
  try {
    const auto reader = image::reader::open(image_dir);
    std::vector<std::uint64_t> words(writer_buffer_size / 8);
    std::size_t buffers = 0;
    for (const auto& pool : reader.info().pools) {
      for (const auto& a : pool.allocations) {
        if (a.size != writer_buffer_size) continue;  // the writer's churn blocks are another size
        auto* at = reinterpret_cast<unsigned char*>(words.data());
        reader.read_range(a.addr, a.size, [&](const unsigned char* bytes, std::size_t n) {
          std::memcpy(at, bytes, n);
          at += n;
        });
        if (const std::string problem = contracts::busy_problem(words.data(), words.size()); !problem.empty())
          return "buffer " + std::to_string(a.addr) + ": " + problem;
        ++buffers;
      }
    }
    if (buffers != writer_buffers) return std::to_string(buffers) + " writer buffers in the image";
    return {};
  } catch (const std::exception& e) {
    return e.what();
  }
}

// A process's entry in `cuda-ckpt ps --json`, or null when it is not listed.
inline nlohmann::json listed_state(pid_t pid) {
  const auto ps = run_process({cuda_ckpt, "ps", "--json"});
  for (const auto& p : nlohmann::json::parse(ps.out))
    if (p.at("pid").get<pid_t>() == pid) return p;
  return nullptr;
}

// Changes the byte at `offset` of a file (an image's data file, past its header): only the checksum of the
// extent holding it can catch that.
inline void flip_byte(const fs::path& file, std::uint64_t offset) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x5a);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
  REQUIRE(f.good());
}

inline void require_untorn(const fs::path& image_dir) {
  const std::string problem = untorn_problem(image_dir);
  INFO(image_dir);
  REQUIRE(problem == "");
}

}  // namespace vmmckpt::test
