// A whole-process image (docs/image-format.md, "Whole-process images"): process.json, the GPU part of
// each process under the shim (gpu/PID, an image of today's format) and CRIU's images (criu/).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace vmmckpt::ckpt {

inline constexpr const char* process_manifest_name = "process.json";
inline constexpr const char* process_format_name = "vmmckpt-process";
inline constexpr int process_format_version = 1;
inline constexpr const char* criu_dir_name = "criu";
inline constexpr const char* gpu_dir_name = "gpu";

struct process_image {
  std::string tool_version;
  std::string created;  // ISO 8601, UTC
  std::string host;
  pid_t root_pid = 0;  // the process CRIU dumped with its descendants; restore gives it back this pid
  struct member {
    pid_t pid = 0;
    pid_t parent = 0;
    std::vector<std::string> command;
    std::string image_id;      // its GPU part's (gpu/PID) manifest image_id
    bool driver_checkpointed;  // its remaining CUDA context went through cuCheckpointProcessCheckpoint
  };
  std::vector<member> processes;  // those under the shim, each with a GPU part
  std::string criu_version;
  struct file {
    std::string name;  // relative to criu/
    std::uint64_t bytes = 0;
    std::uint64_t checksum = 0;  // XXH3-64 of its bytes
  };
  std::vector<file> criu_files;
  std::uint64_t gpu_bytes = 0;  // the GPU parts' data bytes
  double stopped_seconds = 0;   // from the first hold to the process going on (or ending)
  bool left_running = false;    // dumped with --leave-running
  // An incremental image (dump --process --parent): the whole-process image its GPU parts take unchanged
  // blocks from, as the path from the directory holding this one (a family moved together keeps its
  // chain); each GPU part names its own parent too. Empty: every GPU part is full.
  std::string parent;

  std::filesystem::path gpu_image(const std::filesystem::path& dir, pid_t pid) const {
    return dir / gpu_dir_name / std::to_string(pid);
  }
};

// DIR holds a whole-process image (its process.json is there).
bool is_process_image(const std::filesystem::path& dir);

// Reads and checks process.json: every field present, of its type, pids positive and unique, file names
// plain (no "/", "..").  Throws image::image_error naming the defect.
process_image read_process_image(const std::filesystem::path& dir);

// Checks both parts: every CRIU file's size and checksum (none missing, none extra), and each GPU
// part's manifest and image_id (and with `data`, every extent's checksum). Throws image::image_error
// naming the file or part.
void verify_process_image(const std::filesystem::path& dir, const process_image& p, bool data);

// Lists and checksums CRIU's files in DIR/criu (fsyncing each), for process.json.
std::vector<process_image::file> describe_criu_files(const std::filesystem::path& dir);

// Writes DIR/process.json and fsyncs it and DIR.
void write_process_manifest(const std::filesystem::path& dir, const process_image& p);

}  // namespace vmmckpt::ckpt
