// What the operations on a whole job share: the image directory, and a thread per rank.
#include "job/job_run.hpp"

#include <sys/stat.h>

#include <exception>
#include <thread>

#include "vmmckpt/ckpt/driver.hpp"
#include "vmmckpt/ckpt/suspend.hpp"
#include "vmmckpt/ckpt/errors.hpp"
#include "vmmckpt/image/image.hpp"

namespace vmmckpt::ckpt {
namespace fs = std::filesystem;

fs::path new_image_path(const fs::path& given) {
  fs::path out = fs::absolute(given).lexically_normal();
  if (!out.has_filename()) out = out.parent_path();
  if (out.filename().empty()) throw tool_error("the image needs a directory name, not " + given.string());
  std::error_code ec;
  if (fs::symlink_status(out, ec).type() != fs::file_type::not_found)
    throw image::image_error(out.string() + " already exists");
  return out;
}

std::vector<pid_t> running_ranks(const job_spec& job, std::chrono::milliseconds hold_deadline) {
  driver();
  return job_members(job, member_state::running, member_wait_within(hold_deadline));
}

void make_private_directory(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir.parent_path(), ec);
  if (::mkdir(dir.c_str(), 0700) != 0)
    throw image::image_error(dir.string() +
                             ": cannot be created: " + std::error_code(errno, std::generic_category()).message());
}

void run_per_rank(const std::vector<pid_t>& ranks, std::initializer_list<rendezvous*> meetings,
                  const std::function<void(std::size_t)>& body) {
  std::vector<std::exception_ptr> errors(ranks.size());
  std::vector<std::thread> threads;
  threads.reserve(ranks.size());
  for (std::size_t i = 0; i < ranks.size(); ++i)
    threads.emplace_back([&, i] {
      try {
        body(i);
      } catch (...) {
        errors[i] = std::current_exception();
        for (rendezvous* m : meetings) m->abandon("process " + std::to_string(ranks[i]) + "'s part failed");
      }
    });
  for (auto& t : threads) t.join();
  // The error that says why, as it was thrown (its type gives the command's exit status; its text names the
  // process it concerns).
  std::exception_ptr first;
  for (const auto& error : errors) {
    if (!error) continue;
    try {
      std::rethrow_exception(error);
    } catch (const other_rank_failed&) {
      if (!first) first = error;
    } catch (...) {
      std::rethrow_exception(error);
    }
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace vmmckpt::ckpt
