// Chains of incremental images (format 5): where a parent is looked for, which images name one, and merging a chain.
#pragma once

#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "vmmckpt/image/image.hpp"

namespace vmmckpt::image {

// Where a reader looks for the parent of the image in `child_dir`, in order: the path the child
// recorded (a relative one taken from the directory holding the child), then the directory holding
// the child under the recorded path's last name (a chain moved or copied together), unless that is the
// child itself (a parent of the same name elsewhere). Each place is
// taken only if the image there has the recorded image_id and manifest checksum.
std::vector<std::filesystem::path> parent_candidates(const std::filesystem::path& child_dir, const parent_ref& ref);

// The manifest of the image in `dir`, read and decoded without opening its data or its chain; nullopt when
// there is none, or it is not one of ours (too large, unreadable, broken).
std::optional<manifest> peek_manifest(const std::filesystem::path& dir);

// The images directly in `dir` (its subdirectories holding a manifest.json) that name the image
// `image_id` as their parent; unreadable or foreign directories are skipped. Nothing else knows an
// image's children: `cuda-ckpt rm` asks this before it deletes one.
std::vector<std::filesystem::path> children_in(const std::filesystem::path& dir, const std::string& image_id);

// Writes the image `chain` reads (with every block its parents hold) as a full image at `output`,
// without a parent, atomically like every image; every block's checksum is checked on the way. The
// new image has an image_id of its own. `progress` gets the stored bytes done and in all.
manifest merge(const reader& chain, const std::filesystem::path& output, std::uint32_t files = 1,
               const std::function<void(std::uint64_t, std::uint64_t)>& progress = {});

}  // namespace vmmckpt::image
