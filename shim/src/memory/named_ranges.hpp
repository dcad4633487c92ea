// Names a program gives ranges of its GPU memory (vmmckpt_name, vmmckpt.h), so that `cuda-ckpt peek PID NAME`
// finds a tensor without its address. A name stays until the program names another range so, unnames it, or
// frees the memory under it (then it names nothing and is dropped when next looked up).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "vmmckpt/protocol/control_messages.hpp"

namespace vmmckpt::detail {

// Names [addr, addr + size) `name` (replacing what it named before), or, with size 0, unnames it. An empty string,
// or why not (a name control::valid_range_name refuses, too many names).
std::string name_range(const std::string& name, std::uint64_t addr, std::uint64_t size);
// The range named so, if any.
std::optional<control::named_range> named(const std::string& name);
// The name of a named range holding [addr, addr + size), or "".
std::string name_holding(std::uint64_t addr, std::uint64_t size);
// Every name, in name order.
std::vector<control::named_range> all_names();

}  // namespace vmmckpt::detail
