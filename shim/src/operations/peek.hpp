// peek, poke and regions (docs/peek.md): the CPU reads and writes this program's GPU memory while it runs, through
// cuda-ckpt. Only memory the shim owns: a pool's block or the program's own VMM mapping, or a range it named.
#pragma once

#include <vector>

#include "operations/operations.hpp"
#include "vmmckpt/protocol/control_messages.hpp"

namespace vmmckpt::detail {

void serve_peek(client_channel& client, const control::peek_request& request);
// `fds`: the request's descriptors, its bytes the one (the caller closes them).
void serve_poke(client_channel& client, const control::poke_request& request, const std::vector<int>& fds);
void serve_regions(client_channel& client);

}  // namespace vmmckpt::detail
