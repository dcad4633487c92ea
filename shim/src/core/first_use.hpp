// The moment a program first gets memory the shim serves (a pool, a VMM reservation, a served memory
// pool): from then on cuda-ckpt must be able to reach it. The memory floor says when; what happens then is
// the shim's start's to say (operations/startup.cpp), so that nothing here depends on the floors above.
#pragma once

namespace vmmckpt::detail {

using first_use_action = void (*)() noexcept;

// Set once, at the shim's initialisation (a library constructor, before any CUDA call).
void on_first_served_memory(first_use_action action) noexcept;

// Called by every place that serves memory for the first time; runs the action once (cheap after that).
void note_served_memory() noexcept;

}  // namespace vmmckpt::detail
