// Room in the process's descriptor table, made before a hold rather than in it.
#pragma once

namespace vmmckpt {

// Linux grows a descriptor table when a descriptor is made past its end, and while the process has
// more than one thread the growth waits for an RCU grace period (expand_fdtable: 12-21 ms measured).
// A dump makes descriptors in the hold on both sides: the program exports its memory, the tool
// receives it. These make the room beforehand; neither throws, and where they cannot they do nothing.

// Grows the table to at least `slots` entries, at most RLIMIT_NOFILE's soft limit. Free while the
// process has one thread (the tool's start); later it costs the wait once.
void grow_descriptor_table(int slots) noexcept;

// Makes sure `count` more descriptors fit in the table as it is now, growing it now if they would not.
void make_room_for_descriptors(int count) noexcept;

}  // namespace vmmckpt
