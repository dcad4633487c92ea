// The bookkeeping of program-made VMM memory: placement in the windows, tokens, mappings, access.
#include "vmmckpt/pool/vmm_registry.hpp"

#include <algorithm>
#include <iterator>

namespace vmmckpt {
namespace {

constexpr bool is_power_of_two(std::uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

// value rounded up to `alignment` (a power of two), or false when that overflows.
bool round_up(std::uint64_t value, std::uint64_t alignment, std::uint64_t& out) {
  if (value > UINT64_MAX - (alignment - 1)) return false;
  out = (value + alignment - 1) & ~(alignment - 1);
  return true;
}

// The address space a reservation of `size` occupies: whole granules, so that no two share one.
bool span_of(std::uint64_t size, std::uint64_t& span) { return round_up(size, vmm_granularity, span); }

}  // namespace

vmm_registry::vmm_registry(std::uint64_t base, std::uint64_t window, int devices)
    : base_(base), window_(window), devices_(devices) {}

// ---- reservations ---------------------------------------------------------------------------------

int vmm_registry::window_of(std::uint64_t addr, std::uint64_t span) const {
  if (addr < base_ || window_ == 0) return -1;
  const std::uint64_t index = (addr - base_) / window_;
  if (index >= static_cast<std::uint64_t>(devices_)) return -1;
  const std::uint64_t end = window_base(static_cast<int>(index)) + window_;
  if (span > end - addr) return -1;
  return static_cast<int>(index);
}

bool vmm_registry::range_free(std::uint64_t addr, std::uint64_t span) const {
  auto next = reservations_.lower_bound(addr);
  if (next != reservations_.end() && next->first < addr + span) return false;
  if (next != reservations_.begin()) {
    const vmm_reservation& prev = std::prev(next)->second;
    std::uint64_t prev_span = 0;
    span_of(prev.size, prev_span);
    if (prev.addr + prev_span > addr) return false;
  }
  return true;
}

vmm_status vmm_registry::reserve(int device, std::uint64_t size, std::uint64_t alignment, std::uint64_t hint,
                                 std::uint64_t& addr) {
  if (size == 0 || device < 0 || device >= devices_) return vmm_status::invalid_value;
  if (alignment != 0 && !is_power_of_two(alignment)) return vmm_status::invalid_value;
  alignment = std::max(alignment, vmm_granularity);
  std::uint64_t span = 0;
  if (!span_of(size, span)) return vmm_status::out_of_memory;

  // A hint is honoured only where we would be free to place: inside a window, aligned, and free.
  // Elsewhere it is ignored, as the driver treats a hint it cannot honour.
  if (hint != 0 && hint % alignment == 0) {
    const int hinted = window_of(hint, span);
    if (hinted >= 0 && range_free(hint, span)) {
      reservations_.emplace(hint, vmm_reservation{hint, size, hinted});
      addr = hint;
      return vmm_status::ok;
    }
  }

  // Lowest-address first fit in the device's window: the same calls give the same addresses.
  const std::uint64_t begin = window_base(device);
  const std::uint64_t end = begin + window_;
  std::uint64_t cursor = 0;
  if (!round_up(begin, alignment, cursor)) return vmm_status::out_of_memory;
  for (auto it = reservations_.lower_bound(begin); it != reservations_.end() && it->first < end; ++it) {
    if (cursor < end && span <= end - cursor && cursor + span <= it->first) break;
    std::uint64_t taken = 0;
    span_of(it->second.size, taken);
    if (!round_up(std::max(cursor, it->first + taken), alignment, cursor)) return vmm_status::out_of_memory;
  }
  if (cursor >= end || span > end - cursor) return vmm_status::out_of_memory;
  reservations_.emplace(cursor, vmm_reservation{cursor, size, device});
  addr = cursor;
  return vmm_status::ok;
}

vmm_status vmm_registry::check_free(std::uint64_t addr, std::uint64_t size) const {
  const auto exact = reservations_.find(addr);
  if (exact != reservations_.end()) return exact->second.size == size ? vmm_status::ok : vmm_status::invalid_value;
  std::uint64_t span = 0;
  if (size == 0 || !span_of(size, span)) span = vmm_granularity;
  return range_free(addr, span) ? vmm_status::not_found : vmm_status::invalid_value;
}

vmm_status vmm_registry::free_reservation(std::uint64_t addr, std::uint64_t size,
                                          std::vector<std::uint64_t>& release_real) {
  const vmm_status s = check_free(addr, size);
  if (s != vmm_status::ok) return s;
  std::uint64_t span = 0;
  span_of(size, span);
  unmap(addr, span, release_real);
  reservations_.erase(addr);
  return vmm_status::ok;
}

// ---- handles ---------------------------------------------------------------------------------------

std::uint64_t vmm_registry::add_handle(std::uint64_t real, std::uint64_t size, int device, std::uint64_t flags,
                                       const vmm_properties& properties) {
  if (next_counter_ > vmm_token_counter_mask) return 0;
  const std::uint64_t token = vmm_token_tag | next_counter_;
  vmm_handle h;
  h.token = token;
  h.real = real;
  h.size = size;
  h.device = device;
  h.flags = flags;
  h.properties = properties;
  h.refs = 1;
  handles_.emplace(token, h);
  ++next_counter_;
  return token;
}

const vmm_handle* vmm_registry::find_handle(std::uint64_t token) const {
  const auto it = handles_.find(token);
  return it == handles_.end() ? nullptr : &it->second;
}

const vmm_handle* vmm_registry::live_handle(std::uint64_t token) const {
  const vmm_handle* h = find_handle(token);
  return h != nullptr && h->refs > 0 ? h : nullptr;
}

bool vmm_registry::replace_real(std::uint64_t token, std::uint64_t real) {
  const auto it = handles_.find(token);
  if (it == handles_.end()) return false;
  it->second.real = real;
  return true;
}

void vmm_registry::drop_if_unused(std::uint64_t handle, bool owned, std::vector<std::uint64_t>& release_real) {
  if (owned) {
    const auto it = handles_.find(handle);
    if (it == handles_.end() || it->second.refs > 0 || it->second.mappings > 0) return;
    release_real.push_back(it->second.real);
    handles_.erase(it);
  } else {
    const auto it = not_owned_.find(handle);
    if (it == not_owned_.end() || it->second.refs > 0 || it->second.mappings > 0) return;
    if (it->second.origin) dropped_imports_.push_back(*it->second.origin);
    not_owned_.erase(it);
  }
}

vmm_status vmm_registry::release(std::uint64_t token, std::vector<std::uint64_t>& release_real) {
  const auto it = handles_.find(token);
  if (it == handles_.end()) return vmm_status::not_found;
  if (it->second.refs == 0) return vmm_status::invalid_value;
  --it->second.refs;
  drop_if_unused(token, true, release_real);
  return vmm_status::ok;
}

vmm_status vmm_registry::retain_at(std::uint64_t addr, std::uint64_t& token) {
  const std::optional<vmm_mapping> m = mapping_at(addr);
  if (!m) return vmm_status::not_found;
  const auto it = handles_.find(m->token);
  if (it == handles_.end()) return vmm_status::not_found;
  ++it->second.refs;
  token = m->token;
  return vmm_status::ok;
}

// ---- mappings --------------------------------------------------------------------------------------

void vmm_registry::adjust_mappings(const mapping_record& m, int delta) {
  if (m.owned) {
    if (const auto it = handles_.find(m.handle); it != handles_.end()) it->second.mappings += delta;
  } else if (const auto it = not_owned_.find(m.handle); it != not_owned_.end()) {
    it->second.mappings += delta;
  }
}

vmm_status vmm_registry::map(std::uint64_t addr, std::uint64_t size, std::uint64_t offset, std::uint64_t handle) {
  const bool owned = live_handle(handle) != nullptr;
  if (!owned && not_owned_.count(handle) == 0) return vmm_status::not_found;
  if (size == 0 || addr + size < addr) return vmm_status::invalid_value;
  const auto next = mappings_.lower_bound(addr);
  if (next != mappings_.end() && next->first < addr + size) return vmm_status::invalid_value;
  if (next != mappings_.begin() && std::prev(next)->first + std::prev(next)->second.size > addr)
    return vmm_status::invalid_value;
  const mapping_record m{size, handle, offset, owned};
  mappings_.emplace(addr, m);
  adjust_mappings(m, +1);
  return vmm_status::ok;
}

void vmm_registry::unmap(std::uint64_t addr, std::uint64_t size, std::vector<std::uint64_t>& release_real) {
  if (size == 0) return;
  const std::uint64_t end = addr + size < addr ? UINT64_MAX : addr + size;
  auto it = mappings_.lower_bound(addr);
  if (it != mappings_.begin() && std::prev(it)->first + std::prev(it)->second.size > addr) --it;
  std::vector<std::pair<std::uint64_t, bool>> touched;  // handles whose record may now go
  while (it != mappings_.end() && it->first < end) {
    const std::uint64_t m_addr = it->first;
    const mapping_record m = it->second;
    const std::uint64_t m_end = m_addr + m.size;
    it = mappings_.erase(it);
    adjust_mappings(m, -1);
    // The parts outside the range stay mapped, each a record of its own from its own offset.
    if (m_addr < addr) {
      const mapping_record left{addr - m_addr, m.handle, m.offset, m.owned};
      mappings_.emplace(m_addr, left);
      adjust_mappings(left, +1);
    }
    if (m_end > end) {
      const mapping_record right{m_end - end, m.handle, m.offset + (end - m_addr), m.owned};
      it = mappings_.emplace(end, right).first;
      adjust_mappings(right, +1);
      ++it;
    }
    touched.emplace_back(m.handle, m.owned);
  }
  for (const auto& [handle, owned] : touched) drop_if_unused(handle, owned, release_real);
  erase_access(addr, end);
}

std::optional<vmm_mapping> vmm_registry::mapping_at(std::uint64_t addr) const {
  auto it = mappings_.upper_bound(addr);
  if (it == mappings_.begin()) return std::nullopt;
  --it;
  if (!it->second.owned || addr >= it->first + it->second.size) return std::nullopt;
  return vmm_mapping{it->first, it->second.size, it->second.handle, it->second.offset};
}

std::vector<std::pair<std::uint64_t, std::uint64_t>> vmm_registry::mapped_in(std::uint64_t addr,
                                                                             std::uint64_t size) const {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> out;
  const std::uint64_t end = addr + size < addr ? UINT64_MAX : addr + size;
  for (auto it = mappings_.lower_bound(addr); it != mappings_.end() && it->first < end; ++it)
    out.emplace_back(it->first, it->second.size);
  return out;
}

std::optional<vmm_reservation> vmm_registry::reservation_at(std::uint64_t addr) const {
  auto it = reservations_.upper_bound(addr);
  if (it == reservations_.begin()) return std::nullopt;
  --it;
  std::uint64_t span = 0;
  span_of(it->second.size, span);
  if (addr - it->first >= span) return std::nullopt;
  return it->second;
}

// ---- access ----------------------------------------------------------------------------------------

void vmm_registry::split_access_at(std::uint64_t addr) {
  auto it = access_.upper_bound(addr);
  if (it == access_.begin()) return;
  --it;
  if (it->first == addr || it->second.end <= addr) return;
  access_record right{it->second.end, it->second.access};
  it->second.end = addr;
  access_.emplace(addr, std::move(right));
}

void vmm_registry::erase_access(std::uint64_t addr, std::uint64_t end) {
  split_access_at(addr);
  split_access_at(end);
  access_.erase(access_.lower_bound(addr), access_.lower_bound(end));
}

void vmm_registry::coalesce_access(std::uint64_t from, std::uint64_t to) {
  // From the record before the one holding `from`: the range may merge with its left neighbour.
  auto it = access_.lower_bound(from);
  if (it != access_.begin()) --it;
  while (it != access_.end() && it->first <= to) {
    auto next = std::next(it);
    if (next != access_.end() && it->second.end == next->first && it->second.access == next->second.access) {
      it->second.end = next->second.end;
      access_.erase(next);
    } else {
      it = next;
    }
  }
}

void vmm_registry::set_access(std::uint64_t addr, std::uint64_t size, std::span<const vmm_access> access) {
  if (size == 0 || access.empty()) return;
  const std::uint64_t end = addr + size < addr ? UINT64_MAX : addr + size;
  split_access_at(addr);
  split_access_at(end);
  // Gaps in the range get records of their own first, so that every part is then updated alike.
  std::uint64_t cursor = addr;
  for (auto it = access_.lower_bound(addr); cursor < end;) {
    const std::uint64_t gap_end = (it == access_.end() || it->first >= end) ? end : it->first;
    if (cursor < gap_end) access_.emplace(cursor, access_record{gap_end, {}});
    if (it == access_.end() || it->first >= end) break;
    cursor = it->second.end;
    ++it;
  }
  auto by_location = [](const vmm_access& a, const vmm_access& b) {
    return a.location_type != b.location_type ? a.location_type < b.location_type : a.location_id < b.location_id;
  };
  for (auto it = access_.lower_bound(addr); it != access_.end() && it->first < end; ++it) {
    auto& list = it->second.access;
    for (const vmm_access& a : access) {
      const auto at = std::lower_bound(list.begin(), list.end(), a, by_location);
      if (at != list.end() && !by_location(a, *at))
        at->flags = a.flags;
      else
        list.insert(at, a);
    }
  }
  coalesce_access(addr, end);
}

// ---- memory that passes through --------------------------------------------------------------------

void vmm_registry::add_not_owned(std::uint64_t real, vmm_not_owned_kind kind, std::uint64_t size) {
  auto [it, added] = not_owned_.try_emplace(real, not_owned_record{kind, size, 1, 0, std::nullopt, real});
  if (!added) ++it->second.refs;  // the driver hands out the same value again for a second import
}

std::uint64_t vmm_registry::add_import(std::uint64_t real, const vmm_import& origin) {
  if (const auto token = import_token_of(real)) {
    not_owned_record& r = not_owned_.at(*token);
    ++r.refs;
    r.origin = origin;
    return *token;
  }
  const std::uint64_t token = vmm_import_token_tag | (next_import_counter_++ & vmm_token_counter_mask);
  not_owned_.emplace(token, not_owned_record{vmm_not_owned_kind::imported, origin.handle_size, 1, 0, origin, real});
  return token;
}

std::uint64_t vmm_registry::driver_value(std::uint64_t value) const {
  if (!looks_like_import_token(value)) return value;
  const auto it = not_owned_.find(value);
  return it == not_owned_.end() ? 0 : it->second.real;
}

bool vmm_registry::knows_import(std::uint64_t token) const {
  return looks_like_import_token(token) && not_owned_.count(token) == 1;
}

std::optional<std::uint64_t> vmm_registry::import_token_of(std::uint64_t real) const {
  if (real == 0) return std::nullopt;
  for (auto it = not_owned_.lower_bound(vmm_import_token_tag);
       it != not_owned_.end() && looks_like_import_token(it->first); ++it)
    if (it->second.real == real) return it->first;
  return std::nullopt;
}

std::vector<vmm_registry::held_import> vmm_registry::identified_imports() const {
  std::vector<held_import> out;
  for (const auto& [token, r] : not_owned_)
    if (r.origin && looks_like_import_token(token)) out.push_back({token, r.real, r.refs, *r.origin, {}});
  for (const auto& [addr, m] : mappings_) {
    if (m.owned || !looks_like_import_token(m.handle)) continue;
    for (held_import& x : out)
      if (x.token == m.handle) x.mappings.push_back(vmm_mapping{addr, m.size, m.handle, m.offset});
  }
  return out;
}

void vmm_registry::set_import_real(std::uint64_t token, std::uint64_t real, std::uint64_t exporter_start) {
  const auto it = not_owned_.find(token);
  if (it == not_owned_.end() || !looks_like_import_token(token)) return;
  it->second.real = real;
  if (exporter_start != 0 && it->second.origin) it->second.origin->exporter_start = exporter_start;
}

std::vector<vmm_access_range> vmm_registry::access_over(std::uint64_t addr, std::uint64_t size) const {
  std::vector<vmm_access_range> out;
  const std::uint64_t end = addr + size;
  auto it = access_.upper_bound(addr);
  if (it != access_.begin()) --it;
  for (; it != access_.end() && it->first < end; ++it) {
    const std::uint64_t from = std::max(addr, it->first), to = std::min(end, it->second.end);
    if (from < to) out.push_back(vmm_access_range{from, to - from, it->second.access});
  }
  return out;
}

std::vector<vmm_import> vmm_registry::take_dropped_imports() {
  std::vector<vmm_import> out;
  out.swap(dropped_imports_);
  return out;
}

void vmm_registry::retain_not_owned(std::uint64_t real) {
  if (const auto it = not_owned_.find(real); it != not_owned_.end()) ++it->second.refs;
}

void vmm_registry::release_not_owned(std::uint64_t real) {
  const auto it = not_owned_.find(real);
  if (it == not_owned_.end() || it->second.refs == 0) return;
  --it->second.refs;
  std::vector<std::uint64_t> none;
  drop_if_unused(real, false, none);
}

vmm_not_owned_bytes vmm_registry::not_owned_bytes() const {
  vmm_not_owned_bytes out;
  for (const auto& [real, r] : not_owned_) {
    if (r.refs == 0) continue;  // mapped only: counted by its mappings if imported, else gone below
    if (r.kind == vmm_not_owned_kind::host) out.host += r.size;
    if (r.kind == vmm_not_owned_kind::other) out.other += r.size;
  }
  for (const auto& [addr, m] : mappings_) {
    if (m.owned) continue;
    const auto it = not_owned_.find(m.handle);
    // An identified import is in the layout (its exporter saves the bytes); only the others are lacking.
    if (it != not_owned_.end() && it->second.kind == vmm_not_owned_kind::imported && !it->second.origin)
      out.imported += m.size;
  }
  return out;
}

// ---- enumeration -----------------------------------------------------------------------------------

std::vector<vmm_reservation> vmm_registry::reservations() const {
  std::vector<vmm_reservation> out;
  out.reserve(reservations_.size());
  for (const auto& [addr, r] : reservations_) out.push_back(r);
  return out;
}

std::vector<vmm_handle> vmm_registry::handles() const {
  std::vector<vmm_handle> out;
  out.reserve(handles_.size());
  for (const auto& [token, h] : handles_) out.push_back(h);
  return out;
}

std::vector<vmm_mapping> vmm_registry::mappings() const {
  std::vector<vmm_mapping> out;
  for (const auto& [addr, m] : mappings_)
    if (m.owned) out.push_back(vmm_mapping{addr, m.size, m.handle, m.offset});
  return out;
}

std::vector<vmm_access_range> vmm_registry::access() const {
  std::vector<vmm_access_range> out;
  out.reserve(access_.size());
  for (const auto& [addr, a] : access_) out.push_back(vmm_access_range{addr, a.end - addr, a.access});
  return out;
}

// ---- a dump, a suspend, a restore -----------------------------------------------------------------

vmm_layout vmm_registry::layout() const {
  vmm_layout l;
  l.windows.base = base_;
  l.windows.window = window_;
  l.next_token = next_counter_;
  l.reservations = reservations();
  l.handles = handles();
  for (vmm_handle& h : l.handles) h.real = h.mappings = 0;
  l.mappings = mappings();
  for (const auto& [addr, m] : mappings_) {
    if (m.owned) continue;
    const auto it = not_owned_.find(m.handle);
    if (it == not_owned_.end() || !it->second.origin) continue;
    vmm_import x = *it->second.origin;
    x.addr = addr;
    x.size = m.size;
    x.offset = m.offset;
    l.imports.push_back(std::move(x));
  }
  // Access rights over owned memory and identified imports: those of other memory that passes through,
  // mapped in our windows, are not the image's to give again.
  auto in_layout = [&](const mapping_record& m) {
    if (m.owned) return true;
    const auto it = not_owned_.find(m.handle);
    return it != not_owned_.end() && it->second.origin.has_value();
  };
  for (const auto& [addr, a] : access_) {
    auto m = mappings_.upper_bound(addr);
    if (m != mappings_.begin()) --m;
    for (; m != mappings_.end() && m->first < a.end; ++m) {
      if (!in_layout(m->second) || m->first + m->second.size <= addr) continue;
      const std::uint64_t from = std::max(addr, m->first), to = std::min(a.end, m->first + m->second.size);
      if (!l.access.empty() && l.access.back().addr + l.access.back().size == from &&
          l.access.back().access == a.access)
        l.access.back().size += to - from;
      else
        l.access.push_back(vmm_access_range{from, to - from, a.access});
    }
  }
  return l;
}

bool vmm_registry::load(const vmm_layout& l) {
  if (!reservations_.empty() || !handles_.empty() || !mappings_.empty() || !access_.empty()) return false;
  if (l.windows.base != base_ || l.windows.window != window_) return false;
  for (const auto& r : l.reservations) reservations_.emplace(r.addr, r);
  for (vmm_handle h : l.handles) {
    h.real = h.mappings = 0;
    handles_.emplace(h.token, h);
  }
  for (const auto& m : l.mappings) {
    const mapping_record r{m.size, m.token, m.offset, true};
    mappings_.emplace(m.addr, r);
    adjust_mappings(r, +1);
  }
  for (const auto& a : l.access) access_.emplace(a.addr, access_record{a.addr + a.size, a.access});
  next_counter_ = std::max(next_counter_, l.next_token);
  return true;
}

std::uint64_t vmm_registry::unmapped_handle_bytes() const {
  // Each owned handle's size less the union of the parts of it that mappings show.
  std::map<std::uint64_t, std::vector<std::pair<std::uint64_t, std::uint64_t>>> shown;  // token -> [from, to)
  for (const auto& [addr, m] : mappings_)
    if (m.owned) shown[m.handle].emplace_back(m.offset, m.offset + m.size);
  std::uint64_t bytes = 0;
  for (const auto& [token, h] : handles_) {
    std::uint64_t covered = 0;
    if (auto it = shown.find(token); it != shown.end()) {
      auto& parts = it->second;
      std::sort(parts.begin(), parts.end());
      std::uint64_t end = 0;
      for (auto [from, to] : parts) {
        from = std::max(from, end);
        to = std::min(to, h.size);
        if (to > from) covered += to - from;
        end = std::max(end, to);
      }
    }
    bytes += h.size - std::min(covered, h.size);
  }
  return bytes;
}

}  // namespace vmmckpt
