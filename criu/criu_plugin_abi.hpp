// CRIU's plugin interface as CRIU 4.0 to 4.2 define it (criu/include/criu-plugin.h, which Debian's criu package
// does not ship): the descriptor CRIU looks up by name in every .so of its library directory, the hooks this
// plugin fills, and the one function CRIU exports for plugins. Written from the interface's documentation; only
// what this plugin uses.
#pragma once

#include <cstdint>

extern "C" {

// Plugin interface version 0.2.0: CRIU refuses a plugin of a later version.
inline constexpr unsigned criu_plugin_version = (0u << 16) + (2u << 8) + 0u;

// The hooks of CRIU 4.1 (0 to 11); CRIU refuses a plugin that declares more than it knows.
enum criu_plugin_hook : unsigned {
  criu_hook_resume_devices_late = 9,  // int(int pid): restore, the tasks restored and still stopped
  criu_hook_pause_devices = 10,       // int(int pid): dump, before the task is frozen
  criu_hook_checkpoint_devices = 11,  // int(int pid): dump, the tasks frozen
  criu_hook_count = 12,
};

enum criu_plugin_stage : int { criu_stage_dump = 0, criu_stage_pre_dump = 1, criu_stage_restore = 2 };

struct criu_plugin_desc {
  const char* name;
  int (*init)(int stage);
  void (*exit)(int stage, int ret);
  unsigned int version;
  unsigned int max_hooks;
  void* hooks[criu_hook_count];
};

// The images directory of the dump or restore under way, as a descriptor CRIU keeps open.
int criu_get_image_dir(void);

// CRIU's log (criu-log.h): what a plugin prints there is in CRIU's log file whoever runs CRIU, a container
// runtime over RPC too (its stderr goes nowhere a user looks). Levels: 1 error, 2 warning, 3 info, 4 debug.
void print_on_level(unsigned int loglevel, const char* format, ...) __attribute__((format(printf, 2, 3)));

}  // extern "C"
