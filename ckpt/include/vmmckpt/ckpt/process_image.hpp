// A whole-process image (docs/image-format.md, "Whole-process images"): process.json, the GPU part of
// each process under the shim (gpu/PID, an image of today's format) and CRIU's images (criu/).
#pragma once

#include <sys/types.h>

#include <sys/stat.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace vmmckpt::ckpt {

inline constexpr const char* process_manifest_name = "process.json";
// Written before CRIU runs, process.json's fields less the CRIU files: what completes an image whose dump's
// tool died after CRIU succeeded (finish_process_dump). Never in a finished image.
inline constexpr const char* process_intent_name = "intent.json";
// CRIU's log of the dump, in the image (for the curious), and its exit status, written by the shell that runs
// it when it ends: "0" tells a later `restore` or `gc` that CRIU's part is complete although its tool died.
inline constexpr const char* criu_dump_log_name = "criu-dump.log";
inline constexpr const char* criu_dump_status_name = "criu-dump.status";
inline constexpr const char* process_format_name = "vmmckpt-process";
// Version 2 adds the pre-copied parts (dump --process --pre-copy), version 3 whole multi-rank jobs (dump --job
// --process) and processes checkpointed by the driver alone; an image is written in the lowest version that holds
// it, so that older tools read what they can.
inline constexpr int process_format_version = 3;
inline constexpr int process_format_version_pre_copy = 2;
inline constexpr int process_format_version_plain = 1;
inline constexpr const char* criu_dir_name = "criu";
inline constexpr const char* gpu_dir_name = "gpu";
inline constexpr const char* pre_copy_suffix = ".pre";

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
    // dump --process --pre-copy: the image_id of its pre-copied part (gpu/PID.pre, a dump taken while the
    // process ran), the parent of gpu/PID, which holds only the blocks changed since. Empty: none.
    std::string pre_copy_image_id;
  };
  std::vector<member> processes;  // those under the shim, each with a GPU part
  // Processes of the tree that initialized the CUDA driver but hold no GPU memory of the shim's (a launcher such
  // as torchrun that counted the GPUs): only their driver state goes through the driver's checkpoint. Version 3.
  std::vector<pid_t> driver_only;
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
  // A whole multi-rank job (dump --job --process, docs/job-checkpoint.md): its GPU parts were cut at one point of
  // the job and suspended together (gpu/ also holds the job's job.json and its accepted claim), CRIU kept the
  // ranks' TCP connections (--tcp-established), and a restore resumes the ranks together.
  bool job = false;

  std::filesystem::path gpu_image(const std::filesystem::path& dir, pid_t pid) const {
    return dir / gpu_dir_name / std::to_string(pid);
  }
  std::filesystem::path pre_copy_image(const std::filesystem::path& dir, pid_t pid) const {
    return dir / gpu_dir_name / (std::to_string(pid) + pre_copy_suffix);
  }
  bool pre_copied() const {
    for (const auto& m : processes)
      if (!m.pre_copy_image_id.empty()) return true;
    return false;
  }
};

// DIR holds a whole-process image: its process.json is there, a regular file (not through a link).
bool is_process_image(const std::filesystem::path& dir);
// IMAGE is one process's GPU part of a whole-process image: gpu/PID (or gpu/PID.pre) of a DIR that is one.
bool is_process_image_part(const std::filesystem::path& image);

// Reads and checks process.json: a regular file (never through a symbolic link) of bounded size, every
// field present and of its type, numbers in range (pids 1 to 4194304, sizes non-negative integers below
// 2^64, version exactly 1: no float, no negative, nothing coerced), pids unique, file names plain.
// Throws image::image_error naming the file and the field.
process_image read_process_image(const std::filesystem::path& dir);
// The same from text (`where` names it in errors): what the fuzzer drives.
process_image parse_process_manifest(const std::string& text, const std::string& where);

// The intent record (intent.json) of an unfinished image: process.json's fields less criu_files.
process_image read_process_intent(const std::filesystem::path& dir);
process_image parse_process_intent(const std::string& text, const std::string& where);

// Every file and directory under dir, dir first, each with its lstat; no symbolic link is followed (dir
// itself, as named, is). Throws image::image_error when a directory cannot be read.
void for_each_entry(const std::filesystem::path& dir,
                    const std::function<void(const std::filesystem::path&, const struct ::stat&)>& visit);

// The layout: nothing but regular files and directories anywhere in the image (no symbolic link, FIFO,
// device or socket), gpu/ holding exactly one directory per process of process.json, and one more (PID.pre)
// per pre-copied part; a job's, its job.json and job.accepted too.
void check_process_layout(const std::filesystem::path& dir, const process_image& p);

// Every CRIU file's size (checked before it is read) and, with `checksums`, its checksum against process.json,
// none missing, none added. Throws image::image_error naming the file.
void verify_criu_files(const std::filesystem::path& dir, const process_image& p, bool checksums = true);

// Checks both parts: the layout, the CRIU files, and each GPU part's manifest and image_id, pre-copied parts
// included (and with `data`, every extent's checksum). Throws image::image_error naming the file or part.
void verify_process_image(const std::filesystem::path& dir, const process_image& p, bool data);

// Lists and checksums CRIU's files in DIR/criu (regular files only, fsyncing each), for process.json.
std::vector<process_image::file> describe_criu_files(const std::filesystem::path& dir);

// Writes DIR/process.json (under a temporary name, synced, renamed) and fsyncs DIR.
void write_process_manifest(const std::filesystem::path& dir, const process_image& p);
// Renames a complete image from its staging name to its final one, replacing nothing (image::image_error when
// the name is taken), and syncs the directory holding it.
void commit_process_image(const std::filesystem::path& staging, const std::filesystem::path& final_name);
// Writes DIR/intent.json the same way: p's fields less criu_files.
void write_process_intent(const std::filesystem::path& dir, const process_image& p);

}  // namespace vmmckpt::ckpt
