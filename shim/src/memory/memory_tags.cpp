// The tag table: tag names by a small id, each thread's current id, and the id of each tagged block and handle.
#include "memory/memory_tags.hpp"

#include <algorithm>
#include <mutex>
#include <unordered_map>

#include "vmmckpt/support/log.hpp"

namespace vmmckpt::detail {
namespace {

struct tag_table {
  std::mutex mutex;
  std::vector<std::string> names{""};  // id 0: untagged
  std::unordered_map<std::uint64_t, std::uint16_t> blocks, handles;
  // VMM tokens are never made again, so a released handle's entry is only stale: dropped once the table has
  // grown twice past its size at the last sweep, against the tokens still live.
  std::size_t handles_swept_at = 1024;
};

tag_table& the_tags() {
  static tag_table* t = new tag_table;  // never destroyed: threads may allocate at exit
  return *t;
}

thread_local std::uint16_t t_tag = 0;

bool valid_tag(const std::string& tag) {
  if (tag.empty() || tag.size() > max_tag_length) return false;
  for (const char c : tag)
    if (c <= ' ' || c > '~') return false;
  return true;
}

std::unordered_map<std::uint64_t, std::uint16_t>& table_of(tag_table& t, tagged_kind kind) {
  return kind == tagged_kind::pool_block ? t.blocks : t.handles;
}

}  // namespace

std::string set_thread_tag(const std::string& tag) {
  if (tag.empty()) {
    t_tag = 0;
    return {};
  }
  if (!valid_tag(tag))
    return "a tag is 1 to " + std::to_string(max_tag_length) + " printable characters without spaces";
  tag_table& t = the_tags();
  std::lock_guard lock(t.mutex);
  for (std::size_t id = 1; id < t.names.size(); ++id)
    if (t.names[id] == tag) {
      t_tag = static_cast<std::uint16_t>(id);
      any_memory_tagged.store(true, std::memory_order_relaxed);
      return {};
    }
  if (t.names.size() > max_tags) return "a program may use " + std::to_string(max_tags) + " tags at most";
  t.names.push_back(tag);
  t_tag = static_cast<std::uint16_t>(t.names.size() - 1);
  any_memory_tagged.store(true, std::memory_order_relaxed);
  return {};
}

std::string thread_tag() {
  if (t_tag == 0) return {};
  tag_table& t = the_tags();
  std::lock_guard lock(t.mutex);
  return t.names[t_tag];
}

void tag_new(tagged_kind kind, std::uint64_t key, const std::function<bool(std::uint64_t)>& live) noexcept {
  tag_table& t = the_tags();
  std::lock_guard lock(t.mutex);
  auto& table = table_of(t, kind);
  try {
    if (t_tag == 0)
      table.erase(key);
    else
      table[key] = t_tag;
  } catch (...) {
    log::warn("tag {}: no memory to record it; the allocation stays untagged", t.names[t_tag]);
  }
  if (kind != tagged_kind::vmm_handle || !live || t.handles.size() < 2 * t.handles_swept_at) return;
  for (auto it = t.handles.begin(); it != t.handles.end();) it = live(it->first) ? std::next(it) : t.handles.erase(it);
  t.handles_swept_at = std::max<std::size_t>(1024, t.handles.size());
}

void untag_block(std::uint64_t addr) noexcept {
  tag_table& t = the_tags();
  std::lock_guard lock(t.mutex);
  t.blocks.erase(addr);
}

std::string tag_of(tagged_kind kind, std::uint64_t key) {
  tag_table& t = the_tags();
  std::lock_guard lock(t.mutex);
  const auto& table = table_of(t, kind);
  const auto found = table.find(key);
  return found == table.end() ? std::string() : t.names[found->second];
}

}  // namespace vmmckpt::detail
