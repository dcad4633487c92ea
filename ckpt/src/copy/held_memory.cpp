// A held program's memory, mapped into this tool through the handles it exported: at the same addresses where free.
#include "copy/held_memory.hpp"

#include <unistd.h>

#include <algorithm>
#include <map>
#include <optional>

#include "base/cuda_check.hpp"
#include "channel/session.hpp"
#include "vmmckpt/support/address_ranges.hpp"
#include "vmmckpt/pool/exact_reservation.hpp"
#include "vmmckpt/support/hex_text.hpp"
#include "vmmckpt/ckpt/errors.hpp"

namespace vmmckpt::ckpt {

namespace {

// Read-write access for `device` and, where it can reach that device's memory, for `copier`: the device of
// the one context the tool copies every pool with. VMM memory is reachable only from devices named in
// cuMemSetAccess (the driver stages no copy of it through the host), so without it a copy of another
// device's memory would fail.
std::vector<CUmemAccessDesc> access_for(const driver_api& d, CUdevice device, CUdevice copier) {
  std::vector<CUmemAccessDesc> access(1);
  access[0].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access[0].location.id = device;
  access[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  int can = 0;
  if (copier != device && d.cuDeviceCanAccessPeer != nullptr &&
      d.cuDeviceCanAccessPeer(&can, copier, device) == CUDA_SUCCESS && can != 0) {
    access.push_back(access[0]);
    access[1].location.id = copier;
  }
  return access;
}

// [base, base + size) reserved here, at the same address when it is free, else (another program's memory took it:
// the ranks of a job on one device) wherever the driver places it. Returns where it is.
std::uint64_t reserve_range(const driver_api& d, std::uint64_t base, std::uint64_t size, std::uint64_t alignment) {
  std::uint64_t moved_to = 0;
  const CUresult e = reserve_exactly(d, base, size, alignment, moved_to);
  if (e == CUDA_SUCCESS) return base;
  if (moved_to == 0) VMMCKPT_CUDA_TRY(e);
  CUdeviceptr anywhere = 0;
  VMMCKPT_CUDA_TRY(d.cuMemAddressReserve(&anywhere, size, alignment, 0, 0));
  return anywhere;
}

}  // namespace

// One pool: [base, base + size) reserved here (reserve_range), each segment's handle imported and mapped at its
// place there, readable by `device` and by the copying context's device. Everything is undone by the destructor.
class held_memory::pool_mapping {
 public:
  pool_mapping(CUdevice device, CUdevice copier, std::uint64_t base, std::uint64_t size)
      : d_(driver()), base_(base), size_(size), access_(access_for(d_, device, copier)) {
    here_ = reserve_range(d_, base, size, 0);
    reserved_ = true;
  }
  ~pool_mapping() {
    for (const auto& m : mapped_) {
      d_.cuMemUnmap(local(m.addr), m.size);
      d_.cuMemRelease(m.handle);
    }
    if (reserved_) d_.cuMemAddressFree(here_, size_);
  }
  CUdeviceptr local(std::uint64_t addr) const { return here_ + (addr - base_); }
  pool_mapping(const pool_mapping&) = delete;
  pool_mapping& operator=(const pool_mapping&) = delete;

  // Maps one segment; `fd` is closed here whatever happens.
  void map(std::uint64_t addr, std::uint64_t size, int fd) {
    if (addr < base_ || addr + size > base_ + size_ || addr + size < addr) {
      ::close(fd);
      throw tool_error("segment " + hex(addr) + " lies outside the pool");
    }
    CUmemGenericAllocationHandle handle = 0;
    const CUresult imported = d_.cuMemImportFromShareableHandle(
        &handle, reinterpret_cast<void*>(static_cast<std::intptr_t>(fd)), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    ::close(fd);
    VMMCKPT_CUDA_TRY(imported);
    const CUresult mapped = d_.cuMemMap(local(addr), size, 0, handle, 0);
    if (mapped != CUDA_SUCCESS) d_.cuMemRelease(handle);
    VMMCKPT_CUDA_TRY(mapped);
    mapped_.push_back({addr, size, handle});
    VMMCKPT_CUDA_TRY(d_.cuMemSetAccess(local(addr), size, access_.data(), access_.size()));
  }

  // True when [addr, addr + size) is wholly mapped; after the last map(). Asked in address order
  // (every allocation, then every gap between them), each is a check rather than a search.
  bool covers(std::uint64_t addr, std::uint64_t size) const { return cursor_->covers(addr, size); }
  void mapping_done() {
    std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
    for (const auto& m : mapped_) ranges.emplace_back(m.addr, m.size);
    ranges_ = address_ranges(std::move(ranges));
    cursor_.emplace(ranges_);
  }
  bool contains(std::uint64_t addr) const { return addr - base_ < size_; }

 private:
  struct mapped {
    std::uint64_t addr, size;
    CUmemGenericAllocationHandle handle;
  };
  const driver_api& d_;
  std::uint64_t base_ = 0, size_ = 0;
  CUdeviceptr here_ = 0;  // where [base_, base_ + size_) is mapped here
  bool reserved_ = false;
  std::vector<CUmemAccessDesc> access_;
  std::vector<mapped> mapped_;
  address_ranges ranges_;
  mutable std::optional<address_ranges::cursor> cursor_;
};

// The program's own VMM memory: the windows holding its reservations reserved here whole, as the shim
// reserves them (exact_reservation.hpp), each handle imported once, each mapping mapped as the program
// mapped it and readable by the handle's device. Undone by the destructor.
class held_memory::vmm_mapping {
 public:
  explicit vmm_mapping(CUdevice copier) : d_(driver()), copier_(copier) {}
  ~vmm_mapping() {
    for (const auto& m : mapped_) d_.cuMemUnmap(local(m.first), m.second);
    for (const auto& [token, handle] : handles_) d_.cuMemRelease(handle);
    for (const auto& r : reserved_) d_.cuMemAddressFree(r.here, r.size);
  }
  vmm_mapping(const vmm_mapping&) = delete;
  vmm_mapping& operator=(const vmm_mapping&) = delete;

  void reserve_window(std::uint64_t base, std::uint64_t size) {
    for (const auto& r : reserved_)
      if (r.base == base) return;
    reserved_.push_back({base, size, reserve_range(d_, base, size, vmm_granularity)});
  }
  CUdeviceptr local(std::uint64_t addr) const {
    for (const auto& r : reserved_)
      if (addr - r.base < r.size) return r.here + (addr - r.base);
    return addr;
  }
  // `fd` is closed here whatever happens.
  void import(std::uint64_t token, CUdevice device, int fd) {
    CUmemGenericAllocationHandle handle = 0;
    const CUresult imported = d_.cuMemImportFromShareableHandle(
        &handle, reinterpret_cast<void*>(static_cast<std::intptr_t>(fd)), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    ::close(fd);
    VMMCKPT_CUDA_TRY(imported);
    handles_.emplace(token, handle);
    devices_.emplace(token, device);
  }
  void map(const vmmckpt::vmm_mapping& m) {
    const auto it = handles_.find(m.token);
    if (it == handles_.end())
      throw tool_error("the program mapped VMM handle " + hex(m.token) + " but did not send it");
    VMMCKPT_CUDA_TRY(d_.cuMemMap(local(m.addr), m.size, m.offset, it->second, 0));
    mapped_.emplace_back(m.addr, m.size);
    // Worked out once per device: a program maps hundreds of segments, and this runs while it is held.
    const CUdevice device = devices_.at(m.token);
    auto access = access_.find(device);
    if (access == access_.end()) access = access_.emplace(device, access_for(d_, device, copier_)).first;
    VMMCKPT_CUDA_TRY(d_.cuMemSetAccess(local(m.addr), m.size, access->second.data(), access->second.size()));
  }
  void mapping_done() {
    ranges_ = address_ranges(std::vector<std::pair<std::uint64_t, std::uint64_t>>(mapped_));
    cursor_.emplace(ranges_);
  }
  bool contains(std::uint64_t addr) const {
    for (const auto& r : reserved_)
      if (addr - r.base < r.size) return true;
    return false;
  }
  bool covers(std::uint64_t addr, std::uint64_t size) const { return cursor_->covers(addr, size); }

 private:
  struct window {
    std::uint64_t base, size;  // the program's
    CUdeviceptr here;          // where it is reserved here
  };
  const driver_api& d_;
  const CUdevice copier_;
  std::vector<window> reserved_;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> mapped_;    // the program's addresses
  std::map<std::uint64_t, CUmemGenericAllocationHandle> handles_;  // by token
  std::map<std::uint64_t, CUdevice> devices_;                      // by token
  std::map<CUdevice, std::vector<CUmemAccessDesc>> access_;        // by device
  address_ranges ranges_;
  mutable std::optional<address_ranges::cursor> cursor_;
};

held_memory::held_memory(session& s, control::dump_begin_reply& held, received_fds& fds, image::manifest& m) {
  std::size_t next_fd = 0;
  CUdevice copier = 0;  // the device of the tool's context, current since the session opened it
  VMMCKPT_CUDA_TRY(driver().cuCtxGetDevice(&copier));
  for (auto& p : held.pools) {  // not const: each pool's allocations move into the manifest
    const device_description d = session::describe(p.device, held.devices);
    const CUdevice device = s.device_for(d);  // a pool created since hello is found here too

    if (!std::any_of(m.devices.begin(), m.devices.end(),
                     [&](const device_description& x) { return x.ordinal == d.ordinal; }))
      m.devices.push_back(d);

    image::pool pool;
    pool.device = p.device;
    pool.base = p.base;
    pool.size = p.size;
    pool.granularity = p.granularity;
    if (p.vmm) {
      // Mapped below, with the handles; its allocations are the program's mappings.
      pool.kind = image::pool_kind::vmm;
      pool.allocations = std::move(p.allocations);
      m.pools.push_back(std::move(pool));
      continue;
    }
    pools_.push_back(std::make_unique<pool_mapping>(device, copier, p.base, p.size));
    for (const auto& segment : p.segments) {
      if (next_fd >= fds.size()) throw tool_error("the program sent fewer handles than segments");
      pools_.back()->map(segment.addr, segment.size, fds.take(next_fd++));
    }
    pools_.back()->mapping_done();
    for (const auto& a : p.allocations)
      if (!pools_.back()->covers(a.addr, a.size))
        throw tool_error("allocation at " + hex(a.addr) + " is not backed by the handles sent");
    pool.allocations = std::move(p.allocations);
    m.pools.push_back(std::move(pool));
  }
  if (held.vmm) {
    const vmm_layout& l = *held.vmm;
    // Checked before anything is copied: an image the writer would refuse at the end is refused now.
    if (const std::string why = check(l, "vmm"); !why.empty())
      throw tool_error("the program's VMM memory cannot be imaged as it describes it: " + why);
    vmm_ = std::make_unique<vmm_mapping>(copier);
    for (const auto& r : l.reservations) vmm_->reserve_window(l.windows.device_base(r.device), l.windows.window);
    for (const auto& h : l.handles) {
      if (next_fd >= fds.size()) throw tool_error("the program sent fewer handles than its VMM memory has");
      vmm_->import(h.token, s.device_for(session::describe(h.device, held.devices)), fds.take(next_fd++));
    }
    for (const auto& mapping : l.mappings) vmm_->map(mapping);
    vmm_->mapping_done();
    for (const auto& p : m.pools)
      if (p.kind == image::pool_kind::vmm)
        for (const auto& a : p.allocations)
          if (!vmm_->covers(a.addr, a.size))
            throw tool_error("VMM mapping at " + hex(a.addr) + " is not backed by the handles sent");
    m.vmm = l;
  }
}

held_memory::~held_memory() = default;

bool held_memory::mapped(std::uint64_t addr, std::uint64_t size) const {
  for (const auto& p : pools_)
    if (p->contains(addr)) return p->covers(addr, size);
  if (vmm_ && vmm_->contains(addr)) return vmm_->covers(addr, size);
  return false;
}

CUdeviceptr held_memory::local(std::uint64_t addr) const {
  for (const auto& p : pools_)
    if (p->contains(addr)) return p->local(addr);
  return vmm_ ? vmm_->local(addr) : addr;
}

void held_memory::release() {
  pools_.clear();
  vmm_.reset();
}

}  // namespace vmmckpt::ckpt
