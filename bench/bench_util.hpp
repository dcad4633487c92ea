// Small helpers shared by the benchmark programs: timing, statistics, lists (checked CUDA calls: support/cuda_check.hpp).
#pragma once

#include <cuda.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

// Every failed call ends the program with its name and the error's (VMMCKPT_CHECK): a benchmark that
// went on after an error would report numbers for something else.
#include "support/cuda_check.hpp"

namespace bench {

using clock_type = std::chrono::steady_clock;

inline double seconds_since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}

[[noreturn]] inline void usage_error(const char* program, const std::string& what) {
  std::fprintf(stderr, "%s: %s (see the comment at the top of its source in bench/)\n", program, what.c_str());
  std::exit(2);
}

// "--name value" pairs: take(name, value) stores a value and returns true, or returns false for a
// name it does not know (a usage error, as is a name without a value).
template <class Take>
void parse_options(int argc, char** argv, Take take) {
  for (int i = 1; i < argc; ++i) {
    const std::string name = argv[i];
    if (i + 1 >= argc) usage_error(argv[0], name + " needs a value");
    if (!take(name, std::string(argv[++i]))) usage_error(argv[0], "unknown option " + name);
  }
}

// The value at fraction q (0..1) of sorted samples, nearest rank.
inline double quantile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const auto i = static_cast<std::size_t>(q * static_cast<double>(sorted.size() - 1) + 0.5);
  return sorted[std::min(i, sorted.size() - 1)];
}

inline std::vector<std::uint64_t> parse_u64_list(const std::string& s) {
  std::vector<std::uint64_t> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(std::strtoull(item.c_str(), nullptr, 0));
  return out;
}

// The driver's own `name`, looked up in libcuda itself with glibc's own dlsym (by version): past any
// interposer, whose dlsym could hand back its own wrapper. Null when libcuda is not loaded.
inline void* driver_own(const char* name) {
  using dlsym_fn = void* (*)(void*, const char*);
  void* libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
  void* cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (libc == nullptr || cuda == nullptr) return nullptr;
  for (const char* version : {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17"})
    if (void* p = dlvsym(libc, "dlsym", version)) return reinterpret_cast<dlsym_fn>(p)(cuda, name);
  return nullptr;
}

}  // namespace bench
