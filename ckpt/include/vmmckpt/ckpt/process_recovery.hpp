// What a whole-process dump or restore leaves when its tool dies midway, and the one way back from it
// (docs/whole-process.md, "When the tool dies"): each transaction is recorded where `cuda-ckpt ps`, `resume`,
// `restore` and `gc` look, so that whatever stops it, the program runs on, or `resume` brings it back, or its
// image is complete and `restore` brings it back, and ps says which.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace vmmckpt::ckpt {

// One whole-process dump or restore, recorded in its tool's default suspend directory
// (/dev/shm/vmmckpt-UID/whole-process-OP-ROOT-TOOL.json) before it touches a process, removed when it ends.
struct process_transaction {
  enum class kind { dump, restore } op = kind::dump;
  pid_t tool_pid = 0;
  std::uint64_t tool_start = 0;  // clock ticks since boot (suspend_claim::start_time)
  pid_t root_pid = 0;
  // dump: every process of the tree with its start time (CRIU stops them all); restore: the pids CRIU brings
  // back (their start times are later than the tool's, which tells them from processes that had the pid before).
  std::vector<std::pair<pid_t, std::uint64_t>> processes;
  std::vector<pid_t> gpu_pids;    // those with a GPU part: each needs `cuda-ckpt resume` when stopped midway
  std::filesystem::path image;    // the image's final name
  std::filesystem::path staging;  // dump: where it is written (IMAGE.partial-...)
  bool leave_running = false;     // dump: the processes go on afterwards
  // CRIU while it runs for the transaction: it goes on when the tool dies, and the processes are its until it ends.
  pid_t criu_pid = 0;
  std::uint64_t criu_start = 0;
  std::filesystem::path record;  // where this record is (set by write and list)

  // The record appears (written whole, then renamed into place); throws tool_error when it cannot.
  void write();
  // CRIU started for it: recorded (best effort: a record that cannot be rewritten keeps what it said).
  void note_criu(pid_t pid) noexcept;
  // The record goes (no error when it is gone already).
  void remove() const noexcept;
  // Its processes that live now (a pid taken by another process since does not count).
  std::vector<pid_t> alive() const;
};

// This user's records (its own files in its own default suspend directory: root never acts on a record another
// user could have written), each with `record` set; unreadable ones skipped.
std::vector<process_transaction> list_transactions();

// Where a transaction whose tool died has left its processes and its image, and the way back.
struct transaction_outcome {
  enum class kind {
    under_way,  // its tool lives, or CRIU still runs for it
    runs_on,    // its processes run on, none stopped or suspended by it: nothing to do (the record can go)
    resume,     // a process lives, stopped or suspended: `cuda-ckpt resume PID` brings it back
    restore,    // the processes are gone and the image is complete: `cuda-ckpt restore IMAGE` brings them back
    ended,      // the processes ended before this transaction's image was complete (killed, or CRIU killed while
                // its code was in them): nothing of it brings them back, an earlier complete image does
  } what = kind::under_way;
  std::string words;    // what is left, in a sentence
  std::string command;  // the way back, a command line ("" for under_way, runs_on, ended)
};
// Whether a live process is suspended and waits for a resume (waits_for_resume: one loading its memory does not),
// asked (one that does not answer within 5 s, stopped or busy, counts as suspended: it may be; a second was too
// short on a loaded machine, and ps then named a resume of a process that runs).
bool asks_suspended(pid_t pid);
// `suspended(pid)` answers that for the transaction's live processes (default: asks_suspended); ps passes
// what it learnt already.
transaction_outcome assess(const process_transaction& t, const std::function<bool(pid_t)>& suspended = {});

// An unfinished whole-process image (NAME.partial-...) that can be completed: its tool is gone and either its
// process.json is written (the tool died before the rename) or CRIU's dump succeeded (its log in the image
// says so) and its intent record is there. `why_not` says otherwise.
bool finishable(const std::filesystem::path& partial, std::string& why_not);
// Completes such an image: CRIU's files checksummed into process.json (from the intent record), renamed to
// NAME. Returns NAME; throws tool_error or image::image_error when it cannot (NAME taken, the disk full: the
// partial image stays as it was).
std::filesystem::path finish_process_dump(const std::filesystem::path& partial);

// The image at `name`, else the unfinished one a dump left for it (NAME.partial-... next to it, finishable)
// completed and renamed to NAME; `name` unchanged when neither is there (the caller says it does not exist).
std::filesystem::path find_process_image(const std::filesystem::path& name);

// Where a suspended process's GPU part may be now when `recorded` (what its suspend wrote, e.g.
// IMAGE.partial-X/gpu/PID of a whole-process dump) is gone, most likely first: the finished image of the dump
// that wrote it, the images killed restores were bringing it back from (the latest first), IMAGE/gpu/PID by
// the name. Only directories that are there; empty when none is.
std::vector<std::filesystem::path> moved_gpu_parts(pid_t pid, const std::filesystem::path& recorded);

// Continues the processes a whole-process dump whose tool died left stopped (CRIU's --leave-stopped), when pid
// is one of them. Returns what was done in words, or "".
std::string continue_stopped_by_dump(pid_t pid);

// Removes the records of transactions whose tool is gone and that need nothing any more (their processes run
// on, or ended), completes the unfinished image of one whose processes wait for a restore (its record stays:
// ps names the restore until they run again), and ends a CRIU left dumping processes that are gone; returns
// each record removed (path, why). With dry_run nothing is changed.
std::vector<std::pair<std::filesystem::path, std::string>> settle_transactions(bool dry_run);

}  // namespace vmmckpt::ckpt
