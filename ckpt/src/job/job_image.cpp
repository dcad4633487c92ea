// job.json of a job's image: written, read with every field checked, and the ranks' images verified.
#include "vmmckpt/ckpt/job_image.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <initializer_list>
#include <set>
#include <string_view>

#include "base/image_files.hpp"
#include "vmmckpt/image/image.hpp"
#include "vmmckpt/protocol/suspend_claim.hpp"
#include "vmmckpt/support/json_fields.hpp"

namespace vmmckpt::ckpt {
namespace fs = std::filesystem;
namespace jf = json_fields;
using namespace image_files;
namespace {

// What job.json and job-nodes.json share, read into `out`: the format and version checked, the kind (one of
// `kinds`), what wrote it, when and where, and the cut's figures.
template <typename Image>
void decode_shared(const jf::json& j, const char* format, std::initializer_list<std::string_view> kinds, Image& out) {
  if (jf::string_of(j, "", "format") != format) fail("format: not \"" + std::string(format) + "\"");
  if (const auto v = jf::u32_of(j, "", "version"); v != job_format_version)
    fail("version " + std::to_string(v) + ": this cuda-ckpt reads version " + std::to_string(job_format_version));
  out.kind = jf::string_of(j, "", "kind");
  if (std::find(kinds.begin(), kinds.end(), out.kind) == kinds.end())
    fail("kind: \"" + jf::printable(out.kind) + "\" is no job image's");
  out.tool_version = jf::string_of(j, "", "tool_version");
  out.created = jf::string_of(j, "", "created");
  out.host = jf::string_of(j, "", "host");
  out.cut_seconds = jf::number_of(j, "", "cut_seconds");
  out.cut_rounds = jf::int_of(j, "", "cut_rounds");
  out.held_ms = jf::number_of(j, "", "held_ms");
  if (out.cut_seconds < 0 || out.cut_rounds < 0 || out.held_ms < 0) fail("cut_seconds, cut_rounds, held_ms: negative");
}

// The same written: the fields before and after those of one kind of file alone.
template <typename Image>
nlohmann::ordered_json shared_head(const char* format, const Image& j) {
  return {{"format", format},     {"version", job_format_version},
          {"kind", j.kind},       {"tool_version", j.tool_version},
          {"created", j.created}, {"host", j.host}};
}
template <typename Image>
void add_cut(nlohmann::ordered_json& out, const Image& j) {
  out["cut_seconds"] = j.cut_seconds;
  out["cut_rounds"] = j.cut_rounds;
  out["held_ms"] = j.held_ms;
}

// text decoded by `decode`, any defect named with `where`.
template <typename Decode>
auto parse_as(const std::string& text, const std::string& where, Decode decode) {
  try {
    return decode(jf::parse_limited(text, 8));
  } catch (const jf::decode_error& e) {
    fail(where + ": " + e.what());
  } catch (const image::image_error& e) {
    fail(where + ": " + e.what());
  }
}

job_image decode(const jf::json& j) {
  jf::object_at(j, "job.json");
  job_image out;
  decode_shared(j, job_format_name, {"dump", "suspend"}, out);
  const std::int64_t root = jf::i64_of(j, "", "root_pid");
  if (root < 0 || root > pid_limit) fail("root_pid: out of range");
  out.root_pid = static_cast<pid_t>(root);
  const auto& ranks = jf::array_of(j, "", "ranks");
  if (ranks.empty() || ranks.size() > max_ranks) fail("ranks: 1 to " + std::to_string(max_ranks) + " expected");
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const std::string p = jf::index("ranks", i);
    const jf::json& r = jf::object_at(ranks[i], p);
    const std::int64_t pid = jf::i64_of(r, p, "pid");
    if (pid < 1 || pid > pid_limit) fail(p + ".pid: out of range");
    if (!out.ranks.empty() && out.ranks.back().pid >= pid) fail(p + ".pid: not ascending, or repeated");
    out.ranks.push_back({static_cast<pid_t>(pid), jf::string_of(r, p, "image_id")});
    if (out.ranks.back().image_id.empty()) fail(p + ".image_id: empty");
  }
  return out;
}

// Its pids: 1 to max_ranks of them, each in range, ascending.
std::vector<pid_t> pids_of(const jf::json& array, const std::string& p) {
  if (!array.is_array() || array.empty() || array.size() > max_ranks)
    fail(p + ": 1 to " + std::to_string(max_ranks) + " pids expected");
  std::vector<pid_t> out;
  for (const auto& v : array) {
    if (!v.is_number_integer() || v.get<std::int64_t>() < 1 || v.get<std::int64_t>() > pid_limit)
      fail(p + ": a pid out of range");
    if (!out.empty() && out.back() >= v.get<pid_t>()) fail(p + ": not ascending, or repeated");
    out.push_back(v.get<pid_t>());
  }
  return out;
}

job_nodes_image decode_nodes(const jf::json& j) {
  jf::object_at(j, job_nodes_manifest_name);
  job_nodes_image out;
  decode_shared(j, job_nodes_format_name, {"dump"}, out);
  const auto& nodes = jf::array_of(j, "", "nodes");
  if (nodes.empty() || nodes.size() > max_ranks) fail("nodes: 1 to " + std::to_string(max_ranks) + " expected");
  std::set<std::string> names;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    const std::string p = jf::index("nodes", i);
    const jf::json& n = jf::object_at(nodes[i], p);
    job_nodes_image::node node{jf::string_of(n, p, "name"), jf::string_of(n, p, "address"), jf::string_of(n, p, "host"),
                               pids_of(jf::array_of(n, p, "ranks"), p + ".ranks")};
    if (!plain_name(node.name) || node.name == job_nodes_manifest_name || !names.insert(node.name).second)
      fail(p + ".name: not one directory name of its own");
    out.nodes.push_back(std::move(node));
  }
  return out;
}

}  // namespace

bool is_job_nodes_image(const fs::path& dir) {
  struct stat st {};
  return ::lstat((dir / job_nodes_manifest_name).c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

job_nodes_image read_job_nodes_image(const fs::path& dir) {
  fd_guard dir_fd(open_image_dir(dir));
  const fs::path path = dir / job_nodes_manifest_name;
  return parse_as(read_small_file(dir_fd.fd, job_nodes_manifest_name, path, max_job_manifest_bytes), path.string(),
                  decode_nodes);
}

void write_job_nodes_manifest(const fs::path& dir, const job_nodes_image& j) {
  nlohmann::ordered_json out = shared_head(job_nodes_format_name, j);
  add_cut(out, j);
  out["nodes"] = nlohmann::ordered_json::array();
  for (const auto& n : j.nodes)
    out["nodes"].push_back({{"name", n.name}, {"address", n.address}, {"host", n.host}, {"ranks", n.ranks}});
  write_synced(dir, job_nodes_manifest_name, out.dump(2) + "\n");
}

bool is_job_image(const fs::path& dir) {
  struct stat st {};
  return ::lstat((dir / job_manifest_name).c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::optional<std::string> job_resume_command(const fs::path& rank_image) {
  fs::path image = rank_image.lexically_normal();
  if (!image.has_filename()) image = image.parent_path();  // DIR/PID/
  const fs::path dir = image.parent_path();
  if (rank_image.empty() || !is_job_image(dir)) return std::nullopt;
  try {
    const job_image j = read_job_image(dir);
    if (j.root_pid != 0) return "cuda-ckpt resume --job " + std::to_string(j.root_pid);
    std::string ranks;
    for (const auto& r : j.ranks) ranks += (ranks.empty() ? "" : ",") + std::to_string(r.pid);
    return "cuda-ckpt resume --job --ranks " + ranks;
  } catch (const std::exception&) {
    return "cuda-ckpt resume --job";
  }
}

job_image parse_job_manifest(const std::string& text, const std::string& where) {
  return parse_as(text, where, decode);
}

job_image read_job_image(const fs::path& dir) {
  fd_guard dir_fd(open_image_dir(dir));
  const fs::path path = dir / job_manifest_name;
  return parse_job_manifest(read_small_file(dir_fd.fd, job_manifest_name, path, max_job_manifest_bytes), path.string());
}

void write_job_manifest(const fs::path& dir, const job_image& j) {
  nlohmann::ordered_json out = shared_head(job_format_name, j);
  out["root_pid"] = j.root_pid;
  add_cut(out, j);
  out["ranks"] = nlohmann::ordered_json::array();
  for (const auto& r : j.ranks) out["ranks"].push_back({{"pid", r.pid}, {"image_id", r.image_id}});
  write_synced(dir, job_manifest_name, out.dump(2) + "\n");
}

void verify_job_image(const fs::path& dir, const job_image& j, bool data) {
  fd_guard top(open_image_dir(dir));
  std::set<std::string> expected = {job_manifest_name};
  if (j.kind == "suspend") expected.insert(suspend_claim::job_accepted);
  for (const auto& r : j.ranks) expected.insert(std::to_string(r.pid));
  for (const auto& name : names_in(top.fd, dir))
    if (expected.count(name) == 0)
      fail((dir / name).string() + ": not part of the job's image (job.json names it not)");
  for (const auto& name : expected)
    if (name != job_manifest_name && name != suspend_claim::job_accepted) {
      fd_guard rank(open_inner_dir(top.fd, name, dir / name));  // there, a directory, no link
    }
  for (const auto& r : j.ranks) {
    const fs::path image = j.rank_image(dir, r.pid);
    const auto reader = image::reader::open(image);
    if (reader.info().image_id != r.image_id)
      fail(image.string() + ": holds image " + reader.info().image_id + ", job.json names " + r.image_id);
    reader.verify_manifest();
    if (data) reader.verify_data();
  }
}

}  // namespace vmmckpt::ckpt
