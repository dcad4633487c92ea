// The name an image directory is written under until it is complete: NAME.partial-PID-RANDOM beside NAME, renamed
// to NAME in one step. Readers refuse such a name (an interrupted dump leaves it), and `cuda-ckpt gc` finds its
// writer by the pid in it; every writer of an image, a whole-process or a job's image too, names it so.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <string>
#include <string_view>

namespace vmmckpt::image {

inline constexpr std::string_view staging_marker = ".partial-";

// A fresh staging name for an image to be called `final_name`: NAME.partial-<this process's pid>-<16 random hex
// digits>.
std::string staging_name(const std::string& final_name);
// A fresh staging path next to `final_path`.
std::filesystem::path staging_path(const std::filesystem::path& final_path);
// `name`, one path component, is a staging name.
bool is_staging_name(std::string_view name);
// The final name a staging name stands for; empty for a name that is none.
std::string final_name_of_staging(std::string_view name);
// The pid of a staging name's writer; 0 for a name that is none.
pid_t staging_writer(std::string_view name);

}  // namespace vmmckpt::image
