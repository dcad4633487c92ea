// The `ptr 0x<address> <bytes> <api>` line every test program prints per device pointer, read by tests/gpu/check_pool_run.py and the emu e2e tests.
#pragma once

#include <cstddef>
#include <cstdio>

namespace vmmckpt::contracts {

inline void print_ptr(unsigned long long addr, unsigned long long bytes, const char* api) {
  std::printf("ptr 0x%llx %llu %s\n", addr, bytes, api);
}

inline void print_ptr(const void* p, std::size_t bytes, const char* api) {
  print_ptr(reinterpret_cast<unsigned long long>(p), bytes, api);
}

}  // namespace vmmckpt::contracts
