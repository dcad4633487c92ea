// cuda-ckpt dump --job: the cut, then every rank dumped as dump does, the ranks released together once every rank's
// bytes are safe; the job's image appears only complete.
#include <sys/stat.h>
#include <unistd.h>

#include <thread>

#include "base/image_files.hpp"
#include "job/cut_coordinator.hpp"
#include "job/job_run.hpp"
#include "job/rendezvous.hpp"
#include "vmmckpt/ckpt/job.hpp"
#include "vmmckpt/ckpt/job_image.hpp"
#include "vmmckpt/image/image.hpp"
#include "vmmckpt/image/staging_name.hpp"

namespace vmmckpt::ckpt {
namespace fs = std::filesystem;

job_dump_result dump_job(const job_dump_options& o) {
  using clock = std::chrono::steady_clock;
  job_dump_result r;
  const auto start = clock::now();
  r.ranks = running_ranks(o.job, o.hold_deadline);
  const fs::path output = new_image_path(o.output);
  // Written under a staging name next to the final one, renamed in one step at the end.
  const fs::path staging = image::staging_path(output);
  make_private_directory(staging);
  struct remove_unless_committed {
    const fs::path& staging;
    bool committed = false;
    ~remove_unless_committed() {
      std::error_code ec;
      if (!committed) fs::remove_all(staging, ec);
    }
  } cleanup{staging};

  // Connecting, preparing, the cut and every hold, as one process's dump deadline covers all up to its release.
  const deadline until(start + o.hold_deadline);
  job_cut cut(r.ranks, until, r.cut);
  // Every rank's bytes safe before any goes on: a rank released first would write into the others' memory.
  rendezvous safe(r.ranks.size(), [&] { cut.coordinator->release(); });
  r.dumps.resize(r.ranks.size());
  run_per_rank(r.ranks, {&cut.prepared, &safe}, [&](std::size_t i) {
    auto d = rank_options<dump_options>(o, r.ranks[i], staging);
    d.gpu_snapshot = o.gpu_snapshot;
    d.before_hold = [&] { cut.prepared.arrive_and_wait(); };
    d.before_release = [&] { safe.arrive_and_wait(); };
    r.dumps[i] = dump(d);
  });

  job_image j;
  j.kind = "dump";
  j.root_pid = o.job.ranks.empty() ? o.job.root : 0;
  j.cut_seconds = r.cut.seconds;
  j.cut_rounds = r.cut.rounds;
  for (std::size_t i = 0; i < r.ranks.size(); ++i) {
    const image::manifest& m = r.dumps[i].manifest;
    j.ranks.push_back({r.ranks[i], m.image_id});
    j.tool_version = m.tool_version;
    j.created = m.created;
    j.host = m.host;
    r.held_ms = std::max(r.held_ms, r.dumps[i].hold_ms);
  }
  j.held_ms = r.held_ms;
  write_job_manifest(staging, j);
  image_files::commit_directory(staging, output);
  cleanup.committed = true;
  r.image = output;
  r.seconds = std::chrono::duration<double>(clock::now() - start).count();
  return r;
}

}  // namespace vmmckpt::ckpt
