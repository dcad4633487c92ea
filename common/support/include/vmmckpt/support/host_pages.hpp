// Host memory for staging copies between the GPU and files, ready to be pinned.
#pragma once

#include <cstddef>
#include <cstdint>

namespace vmmckpt {

// Anonymous memory, on transparent huge pages where the kernel allows, with every page already
// present. Registering such memory with the driver (cuMemHostRegister) costs a fraction of what
// cuMemHostAlloc of the same size does, which allocates, zeroes and pins 4 KiB pages one by one.
class host_pages {
 public:
  host_pages() = default;
  // data() is nullptr when the memory could not be had. Pages are faulted in by up to `threads`
  // threads at once (the kernel zeroes each: one thread does about 4 GB/s); with 0, each as it is first
  // written.
  explicit host_pages(std::size_t size, unsigned threads = 1);
  ~host_pages();
  host_pages(host_pages&& o) noexcept;
  host_pages& operator=(host_pages&& o) noexcept;
  host_pages(const host_pages&) = delete;
  host_pages& operator=(const host_pages&) = delete;

  void* data() const { return data_; }
  std::size_t size() const { return size_; }

 private:
  void* map_ = nullptr;
  std::size_t map_size_ = 0;
  void* data_ = nullptr;
  std::size_t size_ = 0;
};

// The memory this process can have without swapping (MemAvailable in /proc/meminfo) or passing its cgroup's
// memory.max, in bytes; 0 when unknown.
std::uint64_t available_host_memory();

}  // namespace vmmckpt
