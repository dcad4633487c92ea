// A held program's memory (its pools and the VMM memory it made itself), mapped into this tool through the handles
// it exported: at the same addresses, unless another program's memory mapped here first took them (the ranks of a
// job on one device), then wherever the driver places it.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "vmmckpt/ckpt/control_client.hpp"
#include "vmmckpt/protocol/control_messages.hpp"
#include "vmmckpt/image/image.hpp"

namespace vmmckpt::ckpt {

class session;

class held_memory {
 public:
  // Maps every pool the program handed over (one descriptor per segment, in order) and its VMM
  // memory (one descriptor per handle, after the segments': each reservation reserved here, each
  // mapping mapped as the program mapped it), and describes its devices, pools, allocations and VMM
  // layout in `m`. A tool_error when the handles do not cover the allocations or a range is taken
  // here. The allocations move from `held` into `m`.
  held_memory(session& s, control::dump_begin_reply& held, received_fds& fds, image::manifest& m);
  ~held_memory();
  held_memory(const held_memory&) = delete;
  held_memory& operator=(const held_memory&) = delete;

  // True when [addr, addr + size) (the program's addresses) is wholly mapped here (in one pool). From one thread;
  // quickest asked in address order.
  bool mapped(std::uint64_t addr, std::uint64_t size) const;
  // Where the program's address `addr` is mapped here.
  CUdeviceptr local(std::uint64_t addr) const;
  // Unmaps everything: done once every byte has left the program's memory.
  void release();

 private:
  class pool_mapping;
  class vmm_mapping;
  std::vector<std::unique_ptr<pool_mapping>> pools_;
  std::unique_ptr<vmm_mapping> vmm_;
};

}  // namespace vmmckpt::ckpt
