// A dumped process's pool memory mapped into this process at the same addresses, through exported handles.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <vector>

namespace vmmckpt::ckpt {

struct segment_fd {
  std::uint64_t addr = 0;
  std::uint64_t size = 0;
  int fd = -1;  // owned: closed once imported
};

// Reserves [base, base + size) exactly (a tool_error if the range is taken),
// imports each segment's handle and maps it at its address, readable by
// `device`. Everything is undone by the destructor.
class pool_mapping {
 public:
  pool_mapping(CUdevice device, std::uint64_t base, std::uint64_t size, std::vector<segment_fd> segments);
  ~pool_mapping();
  pool_mapping(const pool_mapping&) = delete;
  pool_mapping& operator=(const pool_mapping&) = delete;

  // True when [addr, addr + size) is wholly mapped.
  bool covers(std::uint64_t addr, std::uint64_t size) const;

 private:
  void release();
  struct mapped {
    std::uint64_t addr, size;
    CUmemGenericAllocationHandle handle;
  };
  std::uint64_t base_ = 0, size_ = 0;
  bool reserved_ = false;
  std::vector<mapped> mapped_;
};

}  // namespace vmmckpt::ckpt
