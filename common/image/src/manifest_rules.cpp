// The rules every image manifest obeys (docs/image-format.md), checked before anything is read or written.
#include <algorithm>
#include <climits>
#include <limits>
#include <string>
#include <vector>

#include "image_detail.hpp"
#include "vmmckpt/pool/alloc_api.hpp"
#include "vmmckpt/pool/pool_layout.hpp"
#include "vmmckpt/image/image.hpp"
#include "vmmckpt/support/json_fields.hpp"

namespace vmmckpt::image {
namespace {

using detail::fail;

// [addr, addr + size) lies inside [lo, end); never overflows.
bool inside(std::uint64_t addr, std::uint64_t size, std::uint64_t lo, std::uint64_t end) {
  return addr >= lo && addr <= end && size <= end - addr;
}

std::string range_text(std::uint64_t addr, std::uint64_t size) { return hex(addr) + "+" + std::to_string(size); }
// What a restore relies on beyond the image's own consistency, so that verify refuses what restore
// cannot use, by the same rules (pool_layout's for the pools, the shim's for the devices).
void check_pool_layout(const manifest& m, const std::vector<const pool*>& pools);

// Program-made VMM memory: the layout obeys its rules, and the pools of kind vmm hold exactly its
// mappings, each in its device's window.
void check_vmm(const manifest& m) {
  std::size_t vmm_allocations = 0;
  for (std::size_t i = 0; i < m.pools.size(); ++i) {
    const pool& p = m.pools[i];
    const std::string name = "pools[" + std::to_string(i) + "]";
    const bool is_vmm = p.kind == pool_kind::vmm;
    for (std::size_t k = 0; k < p.allocations.size(); ++k)
      if ((p.allocations[k].api == alloc_api::cu_mem_map) != is_vmm)
        fail(name + ".allocations[" + std::to_string(k) + "].api " + std::string(name_of(p.allocations[k].api)) +
             (is_vmm ? " is not a VMM mapping, in a pool of kind vmm" : " is a VMM mapping, in a pool of kind pool"));
    if (!is_vmm) continue;
    if (!m.vmm) fail(name + " is of kind vmm, but the image has no vmm layout");
    const vmm_layout& l = *m.vmm;
    if (p.base != l.windows.device_base(p.device) || p.size != l.windows.window)
      fail(name + " (" + range_text(p.base, p.size) + ") is not device " + std::to_string(p.device) + "'s VMM window");
    for (std::size_t k = 0; k < p.allocations.size(); ++k) {
      const allocation& a = p.allocations[k];
      const auto it = std::lower_bound(l.mappings.begin(), l.mappings.end(), a.addr,
                                       [](const vmm_mapping& x, std::uint64_t at) { return x.addr < at; });
      if (it == l.mappings.end() || it->addr != a.addr || it->size != a.size)
        fail(name + ".allocations[" + std::to_string(k) + "] (" + range_text(a.addr, a.size) +
             ") is not one of vmm.mappings");
    }
    vmm_allocations += p.allocations.size();
  }
  if (!m.vmm) return;
  if (m.format < 4) fail("a vmm layout in a format " + std::to_string(m.format) + " image");
  if (const std::string why = check(*m.vmm, "vmm"); !why.empty()) fail(why);
  if (vmm_allocations != m.vmm->mappings.size())
    fail("vmm.mappings has " + std::to_string(m.vmm->mappings.size()) + " entries but the pools of kind vmm store " +
         std::to_string(vmm_allocations));
}

void check_restorable(const manifest& m) {
  check_vmm(m);
  std::vector<const pool*> pools;  // of kind pool: the pool layout's
  for (const pool& p : m.pools)
    if (p.kind == pool_kind::pool) pools.push_back(&p);
  if (!pools.empty()) {
    check_pool_layout(m, pools);
  } else if (m.vmm) {
    // No pool: the restored process uses the default pool layout, which the windows must stay clear of.
    if (const std::string why = validate(m.vmm->windows, pool_config{}); !why.empty())
      fail("the VMM windows (base " + hex(m.vmm->windows.base) + ", window " + std::to_string(m.vmm->windows.window) +
           ") are not ones a process can use: " + why);
  }
  // Every byte of every allocation is in the image: a dump stores each allocation whole, and a
  // restore brings back exactly what the image holds.
  for (std::size_t i = 0; i < m.pools.size(); ++i) {
    const pool& p = m.pools[i];
    std::size_t e = 0;
    for (std::size_t k = 0; k < p.allocations.size(); ++k) {
      const allocation& a = p.allocations[k];
      for (std::uint64_t covered = a.addr; covered < a.addr + a.size;) {
        while (e < p.extents.size() && p.extents[e].addr + p.extents[e].size <= covered) ++e;
        if (e == p.extents.size() || p.extents[e].addr > covered)
          fail("pools[" + std::to_string(i) + "].allocations[" + std::to_string(k) + "] (" +
               range_text(a.addr, a.size) + ") is not wholly in the image: its bytes from " + hex(covered) +
               " are in no extent");
        covered = std::min(a.addr + a.size, p.extents[e].addr + p.extents[e].size);
      }
    }
  }
}

// A restored process places its pools with VMMCKPT_POOL_BASE and VMMCKPT_POOL_SIZE: every pool must
// sit at base + device * size of one such layout, and that layout must be one the shim accepts, with
// the VMM windows (VMMCKPT_VMM_BASE, VMMCKPT_VMM_WINDOW) clear of it.
void check_pool_layout(const manifest& m, const std::vector<const pool*>& pools) {
  const pool& first = *pools.front();
  for (std::size_t i = 0; i < pools.size(); ++i) {
    const pool& p = *pools[i];
    const std::string name = "pools[" + std::to_string(pools[i] - m.pools.data()) + "]";
    if (p.device >= max_devices)
      fail(name + ".device " + std::to_string(p.device) + " is beyond the devices vmmckpt serves (0 to " +
           std::to_string(max_devices - 1) + ")");
    if (p.size != first.size)
      fail(name + ".size " + std::to_string(p.size) + " differs from pools[" +
           std::to_string(pools.front() - m.pools.data()) + "]'s " + std::to_string(first.size) +
           ": the pools follow no one layout (base + device * size)");
  }
  const std::uint64_t stride = first.size;
  if (static_cast<std::uint64_t>(first.device) * stride > first.base)
    fail("pools[" + std::to_string(pools.front() - m.pools.data()) + "]: its base " + hex(first.base) +
         " is below its device's place in any layout (base + device * size)");
  pool_config layout;
  layout.base = first.base - static_cast<std::uint64_t>(first.device) * stride;
  layout.size = stride;
  for (std::size_t i = 0; i < pools.size(); ++i)
    if (pools[i]->base != layout.base + static_cast<std::uint64_t>(pools[i]->device) * stride)
      fail("pools[" + std::to_string(pools[i] - m.pools.data()) + "].base " + hex(pools[i]->base) +
           " is not where pools[" + std::to_string(pools.front() - m.pools.data()) +
           "]'s layout puts its device (base + device * size)");
  if (const std::string why = validate(layout); !why.empty())
    fail("the pools' layout (base " + hex(layout.base) + ", size " + std::to_string(layout.size) +
         ") is not one a process can use: " + why);
  if (m.vmm)
    if (const std::string why = validate(m.vmm->windows, layout); !why.empty())
      fail("the VMM windows (base " + hex(m.vmm->windows.base) + ", window " + std::to_string(m.vmm->windows.window) +
           ") are not ones a process can use with the pools' layout: " + why);
}

// Format 5: a block size readers can use, and a parent named well; older formats have neither.
void check_blocks_and_parent(const manifest& m) {
  if (m.format < 5) {
    if (m.parent) fail("a parent in a format " + std::to_string(m.format) + " image");
    return;
  }
  if (m.block_size < detail::min_block_size || m.block_size > detail::max_block_size ||
      (m.block_size & (m.block_size - 1)) != 0)
    fail("block_size " + std::to_string(m.block_size) + " is not a power of two from " +
         std::to_string(detail::min_block_size) + " to " + std::to_string(detail::max_block_size));
  if (m.parent) {
    const std::string& id = m.parent->image_id;
    if (id.size() != 32 || id.find_first_not_of("0123456789abcdef") != std::string::npos)
      fail("parent.image_id \"" + json_fields::printable(id) + "\" is not 32 lowercase hex digits");
    if (id == m.image_id) fail("parent.image_id is the image's own image_id");
    if (m.parent->path.empty()) fail("parent.path is empty");
  }
}

// Format 5: an extent has one block per block_size of its stored bytes, its checksum combines
// theirs, and only an image with a parent has blocks in it.
void check_extent_blocks(const manifest& m, const extent& e, const std::string& name) {
  if (e.blocks.size() != block_count(e.stored, m.block_size))
    fail(name + " has " + std::to_string(e.blocks.size()) + " blocks, expected " +
         std::to_string(block_count(e.stored, m.block_size)) + " (" + std::to_string(e.stored) +
         " stored bytes in blocks of " + std::to_string(m.block_size) + ")");
  if (!m.parent)
    for (std::size_t b = 0; b < e.blocks.size(); ++b)
      if (e.blocks[b].in_parent)
        fail(name + ".blocks[" + std::to_string(b) + "] is in the parent, but the image has none");
  // A zero block's checksum is checked where it is read, as every block's is: checking it here would hash
  // zeros the manifest only claims (a crafted one could claim terabytes), before any data file is looked at.
  for (std::size_t b = 0; b < e.blocks.size(); ++b) {
    if (!e.blocks[b].zero) continue;
    const std::string bn = name + ".blocks[" + std::to_string(b) + "]";
    if (m.format < 6) fail(bn + " is a zero block, which format " + std::to_string(m.format) + " does not have");
    if (e.blocks[b].in_parent) fail(bn + " is both in the parent and a zero block");
  }
  if (combined_checksum(e.blocks) != e.checksum)
    fail(name + ".checksum " + hex16(e.checksum) + " is not the combined checksum of its blocks (" +
         hex16(combined_checksum(e.blocks)) + ")");
}

// Ordinals are bounded, so the device and pool lists are too, and the pairwise checks stay cheap.
constexpr int max_listed_devices = 1024;

// Rule 3, Identity: a format this reader knows, an image id, a count of data files.
void check_identity(const manifest& m) {
  if (m.format > format_version)
    fail("format " + std::to_string(m.format) + " is newer than this tool understands (" +
         std::to_string(format_version) + ")");
  if (m.format < 1) fail("format " + std::to_string(m.format) + " is not a known format");
  if (m.format >= 3 &&
      (m.image_id.size() != 32 || m.image_id.find_first_not_of("0123456789abcdef") != std::string::npos))
    fail("image_id \"" + json_fields::printable(m.image_id) + "\" is not 32 lowercase hex digits");
  if (m.data_files == 0 || m.data_files > max_data_files)
    fail("data_files is " + std::to_string(m.data_files) + ", expected 1 to " + std::to_string(max_data_files));
  if (m.format == 1 && m.data_files != 1)
    fail("data_files is " + std::to_string(m.data_files) + " in a format 1 image");
}

// Rule 5, Process and devices. Returns, for each ordinal, the index of its entry in devices (-1: none).
std::vector<int> check_process_and_devices(const manifest& m) {
  if (m.pid <= 0 || m.pid > INT_MAX) fail("pid " + std::to_string(m.pid) + " is not a valid process id");
  for (std::size_t i = 0; i < m.lacking.size(); ++i) {
    const std::string p = "lacking[" + std::to_string(i) + "]";
    if (m.lacking[i].kind.empty()) fail(p + ".kind is empty");
    if (m.lacking[i].bytes == 0) fail(p + ".bytes is zero (only memory the image lacks is listed)");
  }
  for (std::size_t i = 0; i < m.ipc_imports.size(); ++i) {
    const std::string p = "ipc_imports[" + std::to_string(i) + "]";
    const ipc_import& im = m.ipc_imports[i];
    if (im.exporter_pid < 1 || im.exporter_pid > 0x7fffffff) fail(p + ".exporter_pid is out of range");
    if (im.size == 0) fail(p + ".size is zero");
    if (im.addr + im.size < im.addr) fail(p + ": addr + size overflows the address space");
  }
  std::vector<int> device_index(max_listed_devices, -1);
  for (std::size_t i = 0; i < m.devices.size(); ++i) {
    const auto& d = m.devices[i];
    const std::string p = "devices[" + std::to_string(i) + "]";
    if (d.ordinal < 0 || d.ordinal >= max_listed_devices)
      fail(p + ".ordinal " + std::to_string(d.ordinal) + " is out of range (0.." +
           std::to_string(max_listed_devices - 1) + ")");
    if (device_index[d.ordinal] >= 0)
      fail(p + ".ordinal " + std::to_string(d.ordinal) + " repeats devices[" + std::to_string(device_index[d.ordinal]) +
           "]");
    device_index[d.ordinal] = static_cast<int>(i);
    if (d.cc_major < 0 || d.cc_minor < 0) fail(p + ": negative compute capability");
  }
  return device_index;
}

// Rule 6, a pool's place: a listed device with no other pool of its kind, an aligned range that overlaps
// no earlier pool. `taken` holds, per kind and ordinal, the pool already there (-1: none).
void check_pool_place(const manifest& m, std::size_t i, const std::vector<int>& device_index,
                      std::vector<int> (&taken)[2]) {
  const pool& pl = m.pools[i];
  const std::string p = "pools[" + std::to_string(i) + "]";
  if (pl.device < 0 || pl.device >= max_listed_devices || device_index[pl.device] < 0)
    fail(p + ".device " + std::to_string(pl.device) + " is not listed in devices");
  std::vector<int>& of_device = taken[pl.kind == pool_kind::vmm ? 1 : 0];
  if (of_device[pl.device] >= 0)
    fail(p + ".device " + std::to_string(pl.device) + " already has pools[" + std::to_string(of_device[pl.device]) +
         "] of the same kind");
  of_device[pl.device] = static_cast<int>(i);
  if (pl.base == 0) fail(p + ".base is zero");
  if (pl.size == 0) fail(p + ".size is zero");
  if (pl.granularity == 0) fail(p + ".granularity is zero");
  if (pl.base % pl.granularity != 0)
    fail(p + ".base " + hex(pl.base) + " is not a multiple of the granularity " + std::to_string(pl.granularity));
  if (pl.size % pl.granularity != 0)
    fail(p + ".size " + std::to_string(pl.size) + " is not a multiple of the granularity " +
         std::to_string(pl.granularity));
  if (pl.base > std::numeric_limits<std::uint64_t>::max() - pl.size)
    fail(p + ": base " + hex(pl.base) + " + size " + std::to_string(pl.size) + " overflows the address space");
  for (std::size_t k = 0; k < i; ++k) {
    const pool& q = m.pools[k];
    if (pl.base < q.base + q.size && q.base < pl.base + pl.size) fail(p + " overlaps pools[" + std::to_string(k) + "]");
  }
}

// Rule 6, a pool's allocations: non-empty, of a known API, inside the pool, sorted and disjoint.
void check_allocations(const pool& pl, const std::string& p) {
  // Names are made only for a defect: a pool of a million allocations is checked in milliseconds.
  auto allocation_name = [&](std::size_t k) { return p + ".allocations[" + std::to_string(k) + "]"; };
  for (std::size_t k = 0; k < pl.allocations.size(); ++k) {
    const allocation& a = pl.allocations[k];
    if (a.size == 0) fail(allocation_name(k) + " has size zero");
    if (!alloc_api_from_value(static_cast<std::uint32_t>(a.api)))
      fail(allocation_name(k) + ".api " + std::to_string(static_cast<std::uint32_t>(a.api)) +
           " is not an allocation API vmmckpt records");
    if (!inside(a.addr, a.size, pl.base, pl.base + pl.size))
      fail(allocation_name(k) + " (" + range_text(a.addr, a.size) + ") is outside the pool (" +
           range_text(pl.base, pl.size) + ")");
    if (k > 0) {
      const allocation& prev = pl.allocations[k - 1];
      if (a.addr < prev.addr)
        fail(allocation_name(k) + " at " + hex(a.addr) + " is out of order (below allocations[" +
             std::to_string(k - 1) + "] at " + hex(prev.addr) + ")");
      if (a.addr < prev.addr + prev.size)
        fail(allocation_name(k) + " overlaps allocations[" + std::to_string(k - 1) + "]");
    }
  }
}

// Where the extents so far end in each data file, and the bytes they store there together.
struct data_file_ends {
  std::vector<std::uint64_t> end;
  std::uint64_t total = 0;
};

// Rule 6, one extent's place in the data files: its file exists, it starts where the one before it there ended.
void place_extent(const manifest& m, const extent& e, const std::string& name, data_file_ends& files) {
  if (e.file >= m.data_files)
    fail(name + ".file is " + std::to_string(e.file) + " but the image has " + std::to_string(m.data_files) +
         " data files");
  std::uint64_t& offset = files.end[e.file];
  if (e.offset != offset)
    fail(name + ".offset is " + std::to_string(e.offset) + ", expected " + std::to_string(offset) +
         " (each data file holds its extents back to back, in manifest order)");
  // Format 5: only the blocks not in the parent are in the data file.
  const std::uint64_t here = m.format >= 5 ? bytes_here(e, m.block_size) : e.stored;
  if (here > std::numeric_limits<std::uint64_t>::max() - detail::data_header_size - offset)
    fail(name + ": data offsets overflow");
  offset += here;
  if (here > std::numeric_limits<std::uint64_t>::max() - files.total) fail(name + ": data_bytes overflows");
  files.total += here;
}

// Rule 6, a pool's extents (its allocations sorted and disjoint by now): non-empty, inside the pool, sorted
// and disjoint, beginning and ending inside allocations, storing their bytes, in place in the data files.
void check_extents(const manifest& m, std::size_t i, data_file_ends& files) {
  const pool& pl = m.pools[i];
  const std::uint64_t end = pl.base + pl.size;
  // `first` is the first allocation ending past the current extent's start; it only moves forward, so the
  // extents are checked in one sweep.
  std::size_t first = 0;
  for (std::size_t k = 0; k < pl.extents.size(); ++k) {
    const extent& e = pl.extents[k];
    auto q = [&] { return detail::extent_name(i, k); };
    if (e.size == 0) fail(q() + " is empty");
    if (!inside(e.addr, e.size, pl.base, end))
      fail(q() + " (" + range_text(e.addr, e.size) + ") is outside the pool (" + range_text(pl.base, pl.size) + ")");
    if (k > 0) {
      const extent& prev = pl.extents[k - 1];
      if (e.addr < prev.addr)
        fail(q() + " at " + hex(e.addr) + " is out of order (below extents[" + std::to_string(k - 1) + "] at " +
             hex(prev.addr) + ")");
      if (e.addr < prev.addr + prev.size) fail(q() + " overlaps extents[" + std::to_string(k - 1) + "]");
    }
    const std::uint64_t e_end = e.addr + e.size;
    while (first < pl.allocations.size() && pl.allocations[first].addr + pl.allocations[first].size <= e.addr) ++first;
    if (first == pl.allocations.size() || pl.allocations[first].addr > e.addr)
      fail(q() + " (" + range_text(e.addr, e.size) + ") does not begin inside an allocation");
    // The bytes it stores: those of every allocation inside its range.
    std::uint64_t stored = 0;
    std::size_t last = first;
    for (std::size_t a = first; a < pl.allocations.size() && pl.allocations[a].addr < e_end; ++a) {
      const allocation& al = pl.allocations[a];
      stored += std::min(e_end, al.addr + al.size) - std::max(e.addr, al.addr);
      last = a;
    }
    if (pl.allocations[last].addr + pl.allocations[last].size < e_end)
      fail(q() + " (" + range_text(e.addr, e.size) + ") does not end inside an allocation");
    if (m.format < 3 && last != first)
      fail(q() + " (" + range_text(e.addr, e.size) + ") is not inside one allocation (format " +
           std::to_string(m.format) + " extents are)");
    if (e.stored != stored)
      fail(q() + ".stored is " + std::to_string(e.stored) + " but the allocations in its range hold " +
           std::to_string(stored) + " bytes");
    if (m.format >= 5) check_extent_blocks(m, e, q());
    first = last;  // the last one may go on into the next extent
    place_extent(m, e, q(), files);
  }
}

}  // namespace

// The manifest rules of docs/image-format.md's Validation, 3 and 5 to 8, in its order.
void validate(const manifest& m) {
  check_identity(m);
  check_blocks_and_parent(m);
  const std::vector<int> device_index = check_process_and_devices(m);
  std::vector<int> taken[2] = {std::vector<int>(max_listed_devices, -1), std::vector<int>(max_listed_devices, -1)};
  data_file_ends files{std::vector<std::uint64_t>(m.data_files, 0)};
  for (std::size_t i = 0; i < m.pools.size(); ++i) {
    check_pool_place(m, i, device_index, taken);
    check_allocations(m.pools[i], "pools[" + std::to_string(i) + "]");
    check_extents(m, i, files);
  }
  if (m.data_bytes != files.total)
    fail("data_bytes is " + std::to_string(m.data_bytes) + " but the extents store " + std::to_string(files.total) +
         " bytes");
  check_restorable(m);
  if (m.data_bytes > std::numeric_limits<std::uint64_t>::max() - detail::data_header_size)
    fail("data_bytes " + std::to_string(m.data_bytes) + " is too large");
}

}  // namespace vmmckpt::image

namespace vmmckpt::image {

std::vector<stored_run> stored_runs(const pool& p, const extent& e) {
  std::vector<stored_run> out;
  const std::uint64_t e_end = e.addr + e.size;
  // The first allocation ending past the extent's start.
  auto it = std::upper_bound(p.allocations.begin(), p.allocations.end(), e.addr,
                             [](std::uint64_t at, const allocation& a) { return at < a.addr + a.size; });
  std::uint64_t offset = 0;
  for (; it != p.allocations.end() && it->addr < e_end; ++it) {
    const std::uint64_t from = std::max(e.addr, it->addr), to = std::min(e_end, it->addr + it->size);
    out.push_back({from, to - from, offset});
    offset += to - from;
  }
  return out;
}

}  // namespace vmmckpt::image
