// A job's image (docs/image-format.md, "Job images"): job.json and one GPU image per rank, named by its pid, as
// dump --job and suspend --job write them. (A whole job through CRIU is a whole-process image: process_image.hpp.)
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace vmmckpt::ckpt {

inline constexpr const char* job_manifest_name = "job.json";
inline constexpr const char* job_format_name = "vmmckpt-job";
inline constexpr int job_format_version = 1;

struct job_image {
  std::string kind;  // "dump" or "suspend"
  std::string tool_version;
  std::string created;  // ISO 8601, UTC
  std::string host;
  pid_t root_pid = 0;  // the launcher the job was named by; 0 when its ranks were named
  struct rank {
    pid_t pid = 0;
    std::string image_id;  // its image's (DIR/PID) manifest image_id
  };
  std::vector<rank> ranks;  // ascending by pid
  double cut_seconds = 0;   // bringing the ranks to one point
  int cut_rounds = 0;
  double held_ms = 0;  // the longest any rank was held

  std::filesystem::path rank_image(const std::filesystem::path& dir, pid_t pid) const {
    return dir / std::to_string(pid);
  }
};

// A job across nodes (dump --nodes, job_nodes.hpp): job-nodes.json, and each node's part as a job's image of its
// own in DIR/NODE (its job.json, one image per rank of that node).
inline constexpr const char* job_nodes_manifest_name = "job-nodes.json";
inline constexpr const char* job_nodes_format_name = "vmmckpt-job-nodes";

struct job_nodes_image {
  std::string kind;  // "dump"
  std::string tool_version;
  std::string created;
  std::string host;  // the coordinator's
  double cut_seconds = 0;
  int cut_rounds = 0;
  double held_ms = 0;
  struct node {
    std::string name;     // its part's directory, DIR/NAME
    std::string address;  // its agent's, HOST:PORT
    std::string host;
    std::vector<pid_t> ranks;  // ascending
  };
  std::vector<node> nodes;
};

bool is_job_nodes_image(const std::filesystem::path& dir);
// Reads and checks job-nodes.json as read_job_image does job.json.
job_nodes_image read_job_nodes_image(const std::filesystem::path& dir);
void write_job_nodes_manifest(const std::filesystem::path& dir, const job_nodes_image& j);

// DIR holds a job's image: its job.json is there, a regular file (not through a link).
bool is_job_image(const std::filesystem::path& dir);
// The command that brings back the whole job a rank suspended by `suspend --job` belongs to, given that rank's
// suspend image (DIR/PID of the job's image): `cuda-ckpt resume --job LAUNCHER`, or with --ranks where the ranks
// were named. Nothing when the image is no job's (a job.json that cannot be read says only `resume --job`).
std::optional<std::string> job_resume_command(const std::filesystem::path& rank_image);
// Reads and checks job.json as strictly as process.json: every field present and of its type, pids in range and
// unique and ascending, version exactly 1. Throws image::image_error naming the file and the field.
job_image read_job_image(const std::filesystem::path& dir);
job_image parse_job_manifest(const std::string& text, const std::string& where);
// Writes DIR/job.json (under a temporary name, synced, renamed) and syncs DIR.
void write_job_manifest(const std::filesystem::path& dir, const job_image& j);
// The layout (job.json, one directory per rank, the job's claim for a suspend, nothing else) and each rank's image
// opening with every rule checked and the image_id job.json names; with `data`, every extent's checksum.
void verify_job_image(const std::filesystem::path& dir, const job_image& j, bool data);

}  // namespace vmmckpt::ckpt
