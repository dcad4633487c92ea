// End-to-end tests of cuda-ckpt restore: a linked list in device memory dumped from one process and walked in another.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "e2e_support.hpp"

using namespace vmmckpt::test;

namespace {

const std::string list_program = programs + "emu_linked_list";
constexpr int node_count = 200;
void write_text(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << text;
  REQUIRE(out.good());
}

// An image of a linked list and the file its builder wrote. The builder is killed before the image is
// used: restore must need nothing but the image and the program's own file.
struct list_image {
  fs::path image;
  fs::path list;
};

list_image make_list_image(const scratch_dir& dir) {
  list_image made{dir.path / "image", dir.path / "list.txt"};
  {
    background_process builder({cuda_ckpt, "run", "--", list_program, "build", made.list.string()});
    REQUIRE(builder.wait_for_output("ready\n"));
    const auto dumped =
        run_process({cuda_ckpt, "dump", std::to_string(builder.pid()), "-o", made.image.string(), "--json"}, {}, 120);
    INFO(describe(dumped));
    REQUIRE(dumped.exit_code == 0);
    REQUIRE(nlohmann::json::parse(dumped.out).at("allocations").get<int>() == node_count);
  }  // the builder is killed here
  const auto verified = run_process({cuda_ckpt, "verify", made.image.string()});
  INFO(describe(verified));
  REQUIRE(verified.exit_code == 0);
  return made;
}

process_result restore(const list_image& img, const std::vector<std::string>& options,
                       const std::vector<std::string>& command, const std::map<std::string, std::string>& env = {}) {
  std::vector<std::string> argv{cuda_ckpt, "restore", img.image.string()};
  argv.insert(argv.end(), options.begin(), options.end());
  argv.push_back("--");
  argv.insert(argv.end(), command.begin(), command.end());
  return run_process(argv, env, 120);
}

// Changes one byte inside a data file's payload, well past the header: only the extent's
// checksum can catch it.
void flip_payload_byte(const fs::path& data) { flip_byte(data, 64 + (fs::file_size(data) - 64) / 2); }

bool has_line(const std::string& out, const std::string& line) {
  return ("\n" + out).find("\n" + line + "\n") != std::string::npos;
}

void require_walked(const process_result& r) {
  INFO(describe(r));
  REQUIRE(r.signal == 0);
  REQUIRE(r.exit_code == 0);
  REQUIRE(has_line(r.out, "walked " + std::to_string(node_count) + " nodes"));
}

}  // namespace

TEST_CASE("restore: the list's pointers are valid and its nodes live allocations in a new process", "[emu][restore]") {
  scratch_dir dir;
  const auto img = make_list_image(dir);
  // walk follows `next` through device memory only, frees every node, and allocates around them.
  require_walked(restore(img, {}, {list_program, "walk", img.list.string()}));
}

TEST_CASE("restore --replay: the same allocation sequence gets the same addresses and finds the bytes",
          "[emu][restore]") {
  scratch_dir dir;
  const auto img = make_list_image(dir);
  const auto r = restore(img, {"--replay"}, {list_program, "replay", img.list.string()});
  INFO(describe(r));
  REQUIRE(r.signal == 0);
  REQUIRE(r.exit_code == 0);
  REQUIRE(has_line(r.out, "replayed " + std::to_string(node_count) + " nodes"));
}

TEST_CASE("restore does not consume the image: it restores twice, in both modes", "[emu][restore]") {
  scratch_dir dir;
  const auto img = make_list_image(dir);
  const std::string before = file_text(img.image / "manifest.json");
  require_walked(restore(img, {}, {list_program, "walk", img.list.string()}));
  require_walked(restore(img, {}, {list_program, "walk", img.list.string()}));
  const auto replayed = restore(img, {"--replay"}, {list_program, "replay", img.list.string()});
  INFO(describe(replayed));
  REQUIRE(replayed.exit_code == 0);
  REQUIRE(file_text(img.image / "manifest.json") == before);
  REQUIRE(run_process({cuda_ckpt, "verify", img.image.string()}).exit_code == 0);
}

TEST_CASE("restore refuses a bad image with a message naming the defect, and starts nothing", "[emu][restore]") {
  scratch_dir dir;
  auto img = make_list_image(dir);
  const fs::path marker = dir.path / "started";
  const std::vector<std::string> command{"sh", "-c", "touch '" + marker.string() + "'"};

  // The marker must work for the refusals to mean anything: a good image starts the command. (A flag, not an
  // early return: Catch2 finds the later sections only in runs that reach them.)
  bool good = false;
  std::string defect;
  SECTION("a good image: the command runs") { good = true; }
  SECTION("a truncated data.bin") {
    const auto data = img.image / "data.bin";
    fs::resize_file(data, fs::file_size(data) - 1000);
    defect = "truncated";
  }
  SECTION("a flipped byte in data.bin") {
    flip_payload_byte(img.image / "data.bin");
    defect = "checksum mismatch";
  }
  SECTION("a manifest of format 99") {
    const auto manifest = img.image / "manifest.json";
    std::string text = file_text(manifest);
    const auto at = text.find("\"format\": 6,");
    REQUIRE(at != std::string::npos);
    text.replace(at, 12, "\"format\": 99,");
    write_text(manifest, text);
    defect = "format 99";
  }
  SECTION("an image directory that does not exist") {
    img.image = dir.path / "no-such-image";
    defect = img.image.string();
  }
  if (good) {
    const auto r = restore(img, {}, command);
    INFO(describe(r));
    REQUIRE(r.exit_code == 0);
    REQUIRE(fs::exists(marker));
    return;
  }
  // The tool's own check agrees that the image is bad (this part holds before restore exists).
  const auto verified = run_process({cuda_ckpt, "verify", img.image.string()});
  REQUIRE(verified.exit_code == 1);

  for (const auto& mode : std::vector<std::vector<std::string>>{{}, {"--replay"}}) {
    const auto r = restore(img, mode, command);
    INFO(describe(r));
    REQUIRE(r.exit_code == 1);
    REQUIRE(r.err.find(defect) != std::string::npos);
    REQUIRE_FALSE(fs::exists(marker));
  }
}

TEST_CASE("restore --no-verify starts at once; the restoring process still refuses damaged bytes", "[emu][restore]") {
  scratch_dir dir;
  const auto img = make_list_image(dir);
  require_walked(restore(img, {"--no-verify"}, {list_program, "walk", img.list.string()}));
  // A flipped byte in the middle of the payload: the command starts, but its memory calls fail
  // and the damaged extent is named; the program never sees the wrong bytes as its own.
  flip_payload_byte(img.image / "data.bin");
  const auto r = restore(img, {"--no-verify"}, {list_program, "walk", img.list.string()});
  INFO(describe(r));
  REQUIRE(r.err.find("checksum mismatch") != std::string::npos);
  REQUIRE_FALSE(has_line(r.out, "walked " + std::to_string(node_count) + " nodes"));
}

TEST_CASE("restore into a process whose pool base is taken: every memory call refused, no crash", "[emu][restore]") {
  scratch_dir dir;
  const auto img = make_list_image(dir);
  // walk-occupied maps 2 MiB at the image's base before CUDA starts.
  const auto r = restore(img, {}, {list_program, "walk-occupied", img.list.string()});
  INFO(describe(r));
  REQUIRE(r.signal == 0);
  REQUIRE(r.exit_code == 0);
  REQUIRE(has_line(r.out, "refused"));
  REQUIRE(r.err.find("0x200000000000") != std::string::npos);  // the taken range is named
}

TEST_CASE("restore with too little device memory for the image: every memory call refused, no crash",
          "[emu][restore]") {
  scratch_dir dir;
  const auto img = make_list_image(dir);
  // The image must need more than the device has, or the test proves nothing.
  const auto manifest = nlohmann::json::parse(file_text(img.image / "manifest.json"));
  REQUIRE(manifest.at("data_bytes").get<std::uint64_t>() > (2u << 20));
  for (const auto& mode : std::vector<std::vector<std::string>>{{}, {"--replay"}}) {
    const auto r =
        restore(img, mode, {list_program, "walk-expect-oom", img.list.string()}, {{"VMMCKPT_EMU_MEM", "2M"}});
    INFO(describe(r));
    REQUIRE(r.signal == 0);
    REQUIRE(r.exit_code == 0);
    REQUIRE(has_line(r.out, "refused"));
    // The shim says why: some error line about memory (the exact words are the shim's).
    std::string err = r.err;
    for (auto& c : err) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    REQUIRE(err.find("memory") != std::string::npos);
  }
}

TEST_CASE("restore --device N: the program runs on another GPU, as the device it had, at the same addresses",
          "[emu][restore]") {
  scratch_dir dir;
  const std::map<std::string, std::string> two_gpus = {{"VMMCKPT_EMU_DEVICES", "2"}};
  list_image made{dir.path / "image", dir.path / "list.txt"};
  {
    background_process builder({cuda_ckpt, "run", "--", list_program, "build", made.list.string()}, two_gpus);
    REQUIRE(builder.wait_for_output("ready\n"));
    REQUIRE(run_process({cuda_ckpt, "dump", std::to_string(builder.pid()), "-o", made.image.string()}, two_gpus)
                .exit_code == 0);
  }
  // The program's device 0 becomes emulated GPU 1 (and GPU 0 its device 1); its pointers still work.
  const auto moved = restore(
      made, {"--device", "1"},
      {"sh", "-c", "echo visible=$CUDA_VISIBLE_DEVICES; exec '" + list_program + "' walk '" + made.list.string() + "'"},
      two_gpus);
  require_walked(moved);
  REQUIRE(has_line(moved.out, "visible=1,0"));
  const auto no_such_gpu = restore(made, {"--device", "5"}, {"true"}, two_gpus);
  REQUIRE(no_such_gpu.exit_code == 1);
  REQUIRE(no_such_gpu.err.find("this machine has 2 GPU(s)") != std::string::npos);
}
