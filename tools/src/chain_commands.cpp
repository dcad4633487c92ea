// `cuda-ckpt merge` and `cuda-ckpt rm`: make a chain of incremental images into a full one, and delete an image no other needs.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <system_error>

#include "cli_options.hpp"
#include "commands.hpp"
#include "exit_codes.hpp"
#include "output.hpp"
#include "vmmckpt/ckpt/process_image.hpp"
#include "vmmckpt/image/image.hpp"
#include "vmmckpt/image/image_chain.hpp"

namespace vmmckpt::tools {

// "IMAGE, its parent P, its parent Q": the chain a reader follows, nearest first.
std::string chain_text(const image::reader& r) {
  std::string out = r.dir().string();
  for (const image::reader* p = r.parent(); p != nullptr; p = p->parent()) out += " <- " + p->dir().string();
  return out;
}

std::size_t chain_length(const image::reader& r) {
  std::size_t n = 0;
  for (const image::reader* p = &r; p != nullptr; p = p->parent()) ++n;
  return n;
}

int merge_command(const std::string& path, const std::string& output, bool json) {
  const auto chain = image::reader::open(path);
  const auto m = image::merge(chain, output, std::max<std::uint32_t>(1, chain.info().data_files));
  if (json) {
    std::cout << nlohmann::json{{"image", output},
                                {"from", path},
                                {"chain", chain_length(chain)},
                                {"image_id", m.image_id},
                                {"bytes", m.data_bytes}}
                     .dump(2)
              << "\n";
  } else {
    std::printf("merged %s (a chain of %zu image%s: %s) into the full image %s (%s)\n", path.c_str(),
                chain_length(chain), chain_length(chain) == 1 ? "" : "s", chain_text(chain).c_str(), output.c_str(),
                human_bytes(m.data_bytes).c_str());
  }
  return exit_ok;
}

namespace {

// The whole-process images next to `dir` (one) whose GPU parts are incremental on one of its parts.
std::vector<std::filesystem::path> process_children(const std::filesystem::path& dir) {
  const auto d = ckpt::read_process_image(dir);
  const auto holder = std::filesystem::absolute(dir).lexically_normal().parent_path();
  std::vector<std::filesystem::path> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(holder, ec)) {
    std::error_code ignored;
    if (!entry.is_directory(ignored) || entry.is_symlink(ignored) || !ckpt::is_process_image(entry.path())) continue;
    for (const auto& m : d.processes)
      if (!image::children_in(entry.path() / ckpt::gpu_dir_name, m.image_id).empty()) {
        out.push_back(entry.path());
        break;
      }
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The image_id a manifest.json names; empty when it names none (an image of format 2 or earlier, or damaged).
std::string image_id_of(const std::filesystem::path& dir) {
  std::ifstream in(dir / "manifest.json", std::ios::binary);
  const auto j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_object() && j.value("magic", "") == "vmmckpt-image" && j.contains("image_id") && j["image_id"].is_string())
    return j["image_id"].get<std::string>();
  return "";
}

// The images that need the blocks of the image at `dir` (`path` as given), into `children`; false, and why
// (rm's message), when they cannot be known.
bool find_children(const std::string& path, const std::filesystem::path& dir, bool whole_process,
                   std::vector<std::filesystem::path>& children, std::string& why) {
  if (whole_process) {
    try {
      children = process_children(dir);
    } catch (const image::image_error& e) {
      why = std::string(e.what()) + "; nothing removed (--force removes it anyway)";
      return false;
    }
    return true;
  }
  const std::string image_id = image_id_of(dir);  // its own manifest names it
  if (image_id.empty()) {
    why = path + ": its manifest.json names no image (not an image of format 3 or later, or damaged); "
                 "nothing removed (--force removes it anyway)";
    return false;
  }
  children = image::children_in(std::filesystem::absolute(dir).lexically_normal().parent_path(), image_id);
  return true;
}

// rm's refusal of a parent whose children need it.
std::string parent_refusal(const std::string& path, const std::vector<std::filesystem::path>& children,
                           bool whole_process) {
  std::string names;
  for (const auto& c : children) names += (names.empty() ? "" : ", ") + c.string();
  // A whole-process chain cannot be merged: each GPU part's image_id is the one its suspended process
  // waits for, and a merged image has one of its own.
  const std::string way_out = whole_process ? "Remove them first" : "Merge them first (cuda-ckpt merge CHILD -o FULL)";
  return path + " is the parent of " + names + ": they need its blocks. " + way_out +
         ", or pass --force to delete it and break them";
}

void report_removed(const std::string& path, const std::vector<std::filesystem::path>& children, bool json) {
  if (json) {
    nlohmann::json broken = nlohmann::json::array();
    for (const auto& c : children) broken.push_back(c.string());
    std::cout << nlohmann::json{{"removed", path}, {"broken_children", broken}}.dump(2) << "\n";
  } else {
    std::printf("removed %s\n", path.c_str());
    for (const auto& c : children) std::printf("%s: now lacks its parent (removed with --force)\n", c.c_str());
  }
}

}  // namespace

int rm_command(const std::string& path, bool force, bool json) {
  // Only an image is deleted: its manifest (or a whole-process image's process.json) must be there; its
  // parent need not be (a child whose parent is gone can go too).
  std::filesystem::path dir(path);
  if (!dir.has_filename()) dir = dir.parent_path();
  std::error_code ec;
  const bool whole_process = ckpt::is_process_image(dir);
  if (std::filesystem::is_symlink(dir, ec) ||
      (!whole_process && !std::filesystem::is_regular_file(dir / "manifest.json", ec)))
    return report_failure("rm", json,
                          path + ": not an image directory (no manifest.json or process.json); nothing removed",
                          exit_failure);
  std::vector<std::filesystem::path> children;
  if (std::string why; !find_children(path, dir, whole_process, children, why) && !force)
    return report_failure("rm", json, why, exit_failure);
  if (!children.empty() && !force)
    return report_failure("rm", json, parent_refusal(path, children, whole_process), exit_failure);
  std::filesystem::remove_all(dir, ec);
  if (ec) return report_failure("rm", json, path + ": " + ec.message(), exit_failure);
  report_removed(path, children, json);
  return exit_ok;
}

subcommand add_merge(CLI::App& app) {
  struct options {
    std::string image, output;
    bool json = false;
  };
  auto o = std::make_shared<options>();
  auto* command = app.add_subcommand("merge", "Write an incremental image and its parents as one full image");
  add_image(command, o->image);
  command->add_option("-o,--output", o->output, "The full image to create")->required()->type_name("DIR");
  command->add_flag("--json", o->json, "Print the result as JSON");
  command->footer("Usage: cuda-ckpt merge IMAGE -o FULL\n"
                  "Every block is read from wherever the chain holds it and checked; FULL has no parent and appears\n"
                  "only once complete and synced. The chain is left as it was.");

  return {command, [o] { return merge_command(o->image, o->output, o->json); }};
}

subcommand add_rm(CLI::App& app) {
  struct options {
    std::string image;
    bool force = false, json = false;
  };
  auto o = std::make_shared<options>();
  auto* command = app.add_subcommand("rm", "Delete an image, unless another image in its directory is its child");
  add_image(command, o->image);
  command->add_flag("--force", o->force, "Delete it even if incremental images name it as their parent (they break)");
  command->add_flag("--json", o->json, "Print the result as JSON");
  command->footer("An image cannot know its children: rm looks for them among the images next to it (the same\n"
                  "directory), where dump --parent leaves them by default. A child kept elsewhere is not seen.");

  return {command, [o] { return rm_command(o->image, o->force, o->json); }};
}

}  // namespace vmmckpt::tools
