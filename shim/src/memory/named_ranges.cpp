// The table of names a program gave ranges of its memory: small (control::max_names), under one lock.
#include "memory/named_ranges.hpp"

#include <map>
#include <mutex>

namespace vmmckpt::detail {
namespace {

struct name_table {
  std::mutex mutex;
  std::map<std::string, control::named_range> ranges;
};

name_table& the_names() {
  static name_table* t = new name_table;  // never destroyed: threads may call at exit
  return *t;
}

}  // namespace

std::string name_range(const std::string& name, std::uint64_t addr, std::uint64_t size) {
  if (!control::valid_range_name(name))
    return "a name is 1 to " + std::to_string(control::max_name_length) +
           " printable characters without spaces, and not a number";
  if (size != 0 && addr + size < addr) return "the range wraps around the address space";
  name_table& t = the_names();
  std::lock_guard lock(t.mutex);
  if (size == 0) {
    t.ranges.erase(name);
    return {};
  }
  if (t.ranges.size() >= control::max_names && t.ranges.count(name) == 0)
    return "a program may name " + std::to_string(control::max_names) + " ranges at most";
  t.ranges[name] = control::named_range{name, addr, size};
  return {};
}

std::optional<control::named_range> named(const std::string& name) {
  name_table& t = the_names();
  std::lock_guard lock(t.mutex);
  const auto found = t.ranges.find(name);
  if (found == t.ranges.end()) return std::nullopt;
  return found->second;
}

std::string name_holding(std::uint64_t addr, std::uint64_t size) {
  name_table& t = the_names();
  std::lock_guard lock(t.mutex);
  for (const auto& [name, r] : t.ranges)
    if (addr >= r.addr && addr - r.addr <= r.size && size <= r.size - (addr - r.addr)) return name;
  return {};
}

std::vector<control::named_range> all_names() {
  name_table& t = the_names();
  std::lock_guard lock(t.mutex);
  std::vector<control::named_range> out;
  for (const auto& [name, r] : t.ranges) out.push_back(r);
  return out;
}

}  // namespace vmmckpt::detail
