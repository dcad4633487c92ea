// The device memory that passes through the shim, counted by kind: what an image of this process lacks.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <vector>

#include "vmmckpt/protocol/control_messages.hpp"

namespace vmmckpt::detail {

enum class passthrough_kind { managed, arrays, memory_pools };

// A passthrough allocation the driver made: `key` is its pointer (managed, memory pools) or its
// handle (arrays). Never fails: when the record cannot be kept, the bytes stay counted for good,
// since refusing a dump is better than an image silently short of them.
void note_passthrough(passthrough_kind kind, std::uint64_t key, std::uint64_t bytes) noexcept;
// The driver freed or destroyed it; keys never noted are ignored. Cheap while nothing is noted.
void forget_passthrough(std::uint64_t key) noexcept;

// Bytes of a CUDA array of this descriptor: width * height * depth * channels * element size, an
// estimate (the driver pads and tiles as it likes and does not say how much).
std::uint64_t array_bytes(const CUDA_ARRAY3D_DESCRIPTOR& desc) noexcept;
// The same summed over a mipmapped array's levels, each half the last in every dimension.
std::uint64_t mipmapped_array_bytes(const CUDA_ARRAY3D_DESCRIPTOR& desc, unsigned levels) noexcept;

// Every kind of live memory the shim does not own, VMM that passes through included; only kinds
// with bytes. Throws only for want of memory.
std::vector<control::not_owned_memory> not_owned_memory();

}  // namespace vmmckpt::detail
