// Who called an entry point: for the figures that tell a library's share of a process's memory apart.
#pragma once

namespace vmmckpt::detail {

// Whether the code at `return_address` is NCCL's (a library whose file name starts with "libnccl"). A dladdr lookup:
// for calls that are rare (creating VMM memory or a memory pool), not for the allocation paths.
bool called_from_nccl(const void* return_address) noexcept;

}  // namespace vmmckpt::detail
