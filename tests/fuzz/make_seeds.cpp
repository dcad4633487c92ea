// Writes the fuzzers' seed corpus: small valid images made with the library's own writer, plus near-misses.
//
// Usage: make_seeds OUT_DIR   (scripts/fuzz.sh does not need it: the corpus is committed in
// tests/fuzz/corpus/; run it again when the format changes:
//   build-fuzz/bin/make_seeds tests/fuzz/corpus)
// Writes OUT_DIR/image/NAME (image_fuzzer's input format, see image_fuzzer.cpp),
// OUT_DIR/manifest/NAME.json and OUT_DIR/process/NAME (process_image_fuzzer's). Everything is deterministic, so re-running gives the same files.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "vmmckpt/image/image.hpp"

namespace fs = std::filesystem;
namespace img = vmmckpt::image;
using ojson = nlohmann::ordered_json;

namespace {

constexpr std::uint64_t base0 = 0x200000000000ULL;
constexpr std::uint64_t gran = 2ULL << 20;

using bytes = std::vector<unsigned char>;

bytes pattern(std::uint64_t size, std::uint64_t seed) {
  bytes v(size);
  std::uint64_t x = seed * 0x9e3779b97f4a7c15ULL + 1;
  for (auto& b : v) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b = static_cast<unsigned char>(x);
  }
  return v;
}

bytes read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + p.string());
  return bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_file(const fs::path& p, const bytes& b) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  if (!out) throw std::runtime_error("cannot write " + p.string());
}

bytes to_bytes(const std::string& s) { return bytes(s.begin(), s.end()); }

// The data files of an input, one after another with the fuzzer's separator between them
// (tests/fuzz/image_fuzzer.cpp); the tables come before the first.
const std::string file_separator = "\n--vmmckpt-next-data-file--\n";

// image_fuzzer's input: u32 little-endian manifest length, the manifest, the tables, the data files.
bytes fuzz_input(const bytes& manifest, const bytes& tables, const bytes& data) {
  bytes out;
  const auto n = static_cast<std::uint32_t>(manifest.size());
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<unsigned char>(n >> (8 * i)));
  out.insert(out.end(), manifest.begin(), manifest.end());
  out.insert(out.end(), tables.begin(), tables.end());
  out.insert(out.end(), file_separator.begin(), file_separator.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

struct planned_pool {
  int device;
  std::uint64_t base, size;
  std::vector<img::allocation> allocations;
  struct planned_extent {
    std::uint64_t addr, size;
    std::uint64_t stored = 0;  // 0: all `size` bytes (the extent lies in one allocation)
  };
  std::vector<planned_extent> extents;
};

img::manifest base_manifest(std::vector<std::string> command, int devices) {
  img::manifest m;
  m.tool_version = "0.1.0";
  m.created = "2026-11-22T10:00:00Z";
  m.host = "node-7";
  m.pid = 4242;
  m.command = std::move(command);
  for (int d = 0; d < devices; ++d)
    m.devices.push_back({d, "NVIDIA H200", "GPU-0000000" + std::to_string(d) + "-2222-3333-4444-555555555555", 9, 0});
  m.hold_us = 1234;
  return m;
}

struct image_files {
  bytes manifest, tables, data;  // as the image holds them (data: its data files joined)
  img::manifest decoded;         // as the reader reads it back
};

// Where each data file starts in a joined `data`.
std::vector<std::size_t> file_starts(const bytes& data) {
  std::vector<std::size_t> starts{0};
  for (auto at = data.begin();;) {
    at = std::search(at, data.end(), file_separator.begin(), file_separator.end());
    if (at == data.end()) return starts;
    at += static_cast<std::ptrdiff_t>(file_separator.size());
    starts.push_back(static_cast<std::size_t>(at - data.begin()));
  }
}

// A planned pool's description, its extents still to be written.
img::pool pool_of(const planned_pool& pp) {
  img::pool pl;
  pl.device = pp.device;
  pl.base = pp.base;
  pl.size = pp.size;
  pl.granularity = gran;
  pl.allocations = pp.allocations;
  return pl;
}

// Writes the image with img::writer (so the seeds are exactly what dumps look like), extent k in
// data file k % files, checks that the reader takes it, and returns its manifest and data files.
image_files write_image(const fs::path& scratch, const std::string& name, img::manifest m,
                        const std::vector<planned_pool>& pools, std::uint32_t files = 1) {
  const fs::path dir = scratch / name;
  m.data_files = files;
  {
    img::writer w(dir, files);
    std::uint32_t next_file = 0;
    std::uint64_t seed = 1;
    for (const auto& pp : pools) {
      img::pool pl = pool_of(pp);
      for (const auto& pe : pp.extents) {
        const std::uint64_t size = pe.stored != 0 ? pe.stored : pe.size;
        const bytes b = pattern(size, seed++);
        const std::uint32_t f = next_file++ % files;
        w.begin_extent(f, pe.addr, pe.size, size);
        // Fed in two pieces, as a dump that copies through a staging buffer does.
        const std::size_t half = b.size() / 2;
        w.write(f, b.data(), half);
        w.write(f, b.data() + half, b.size() - half);
        pl.extents.push_back(w.end_extent(f));
        m.data_bytes += size;
      }
      m.pools.push_back(std::move(pl));
    }
    w.commit(m);
  }
  const img::reader r = img::reader::open(dir);
  r.verify_data();
  image_files out{read_file(dir / "manifest.json"), read_file(dir / "tables.bin"), read_file(dir / "data.bin"),
                  r.info()};
  for (std::uint32_t k = 1; k < files; ++k) {
    out.data.insert(out.data.end(), file_separator.begin(), file_separator.end());
    const bytes more = read_file(dir / ("data." + std::to_string(k) + ".bin"));
    out.data.insert(out.data.end(), more.begin(), more.end());
  }
  return out;
}

// Each data file's header records the manifest's checksum (docs/image-format.md, bytes 24..31) and
// the format (12..15): set to those of `manifest_text`, so that an edited image is refused for its
// edit and not merely for the changed manifest.
bytes with_headers_for(bytes data, const bytes& manifest_text, std::uint32_t format) {
  const std::uint64_t sum = XXH3_64bits(manifest_text.data(), manifest_text.size());
  for (const std::size_t start : file_starts(data)) {
    for (int i = 0; i < 4; ++i)
      data[start + 12 + static_cast<std::size_t>(i)] = static_cast<unsigned char>(format >> (8 * i));
    for (int i = 0; i < 8; ++i)
      data[start + 24 + static_cast<std::size_t>(i)] = static_cast<unsigned char>(sum >> (8 * i));
  }
  return data;
}

// An incremental image of the image written as scratch/"parent" with `pools` (the same pools, bytes made
// the same way), in which extent `changed` differs: the others' blocks are left to the parent, which
// it names by the relative path "parent" (image_fuzzer writes a parent there).
image_files write_child(const fs::path& scratch, const std::string& name, img::manifest m,
                        const std::vector<planned_pool>& pools, std::size_t changed) {
  const fs::path dir = scratch / name;
  const img::reader parent = img::reader::open(scratch / "parent");
  {
    img::writer w(dir, 1);
    std::uint64_t seed = 1;
    std::size_t k = 0;
    for (std::size_t p = 0; p < pools.size(); ++p) {
      const auto& pp = pools[p];
      img::pool pl = pool_of(pp);
      for (std::size_t e = 0; e < pp.extents.size(); ++e, ++k) {
        const auto& pe = pp.extents[e];
        const std::uint64_t size = pe.stored != 0 ? pe.stored : pe.size;
        bytes b = pattern(size, seed++);
        if (k == changed) b[0] ^= 1;
        const img::extent& old = parent.info().pools[p].extents[e];
        w.begin_extent(0, pe.addr, pe.size, size);
        for (std::uint64_t at = 0; at < size; at += img::write_block_size) {
          const std::size_t n = static_cast<std::size_t>(std::min(img::write_block_size, size - at));
          const std::uint64_t sum = img::block_checksum(b.data() + at, n);
          if (old.blocks[at / img::write_block_size].checksum == sum)
            w.inherit_block(0, n, sum);
          else
            w.write_block(0, b.data() + at, n, sum);
        }
        pl.extents.push_back(w.end_extent(0));
        m.data_bytes += img::bytes_here(pl.extents.back(), m.block_size);
      }
      m.pools.push_back(std::move(pl));
    }
    m.parent = img::parent_ref{parent.info().image_id, parent.manifest_checksum(), "parent"};
    w.commit(m);
  }
  const img::reader r = img::reader::open(dir);
  r.verify_data();
  return {read_file(dir / "manifest.json"), read_file(dir / "tables.bin"), read_file(dir / "data.bin"), r.info()};
}

// image_fuzzer's input for an image and its parent.
const std::string parent_separator = "\n--vmmckpt-parent-image--\n";
bytes chain_input(const image_files& child, const image_files& parent) {
  bytes out = fuzz_input(child.manifest, child.tables, child.data);
  out.insert(out.end(), parent_separator.begin(), parent_separator.end());
  const bytes p = fuzz_input(parent.manifest, parent.tables, parent.data);
  out.insert(out.end(), p.begin(), p.end());
  return out;
}

struct seed_writer {
  fs::path out;
  int count = 0;
  void image(const std::string& name, const bytes& manifest, const bytes& tables, const bytes& data) {
    write_file(out / "image" / name, fuzz_input(manifest, tables, data));
    ++count;
  }
  void manifest(const std::string& name, const bytes& text) {
    write_file(out / "manifest" / (name + ".json"), text);
    ++count;
  }
  // A near-miss in the manifest file's own fields (format 3): the image, with the good tables and data.
  void edited(const std::string& name, const image_files& good, void (*edit)(ojson&)) {
    ojson j = ojson::parse(good.manifest.begin(), good.manifest.end());
    edit(j);
    const bytes text = to_bytes(j.dump(2) + "\n");
    image(name, text, good.tables, with_headers_for(good.data, text, img::format_version));
  }
  // A near-miss in the tables, as the manifest's full JSON form holds them: the edited full form
  // alone (manifest_fuzzer's input), and as a format 2 image, whose manifest file holds its tables.
  void edited_tables(const std::string& name, const image_files& good, void (*edit)(ojson&)) {
    img::manifest m = good.decoded;
    m.format = 2;
    ojson j = ojson::parse(img::to_json(m));
    edit(j);
    const bytes text = to_bytes(j.dump(2) + "\n");
    manifest(name, text);
    image(name, text, {}, with_headers_for(good.data, text, 2));
  }
  // A near-miss in tables.bin's bytes, with the checksum in the manifest made to match them.
  void edited_binary_tables(const std::string& name, const image_files& good, void (*edit)(bytes&)) {
    bytes tables = good.tables;
    edit(tables);
    ojson j = ojson::parse(good.manifest.begin(), good.manifest.end());
    char sum[17];
    std::snprintf(sum, sizeof sum, "%016llx",
                  static_cast<unsigned long long>(XXH3_64bits(tables.data(), tables.size())));
    j["tables"]["checksum"] = sum;
    j["tables"]["bytes"] = tables.size();
    const bytes text = to_bytes(j.dump(2) + "\n");
    image(name, text, tables, with_headers_for(good.data, text, img::format_version));
  }
};

// process_image_fuzzer's input (tests/fuzz/process_image_fuzzer.cpp): process.json, then each entry of the
// image's layout as "\n--vmmckpt-entry-- TYPE PATH\n" and its content.
struct process_entry {
  char type;  // f, d, l, p
  std::string path;
  bytes content;
};
bytes process_input(const std::string& manifest, const std::vector<process_entry>& entries) {
  bytes out = to_bytes(manifest);
  for (const auto& e : entries) {
    const bytes header = to_bytes("\n--vmmckpt-entry-- " + std::string(1, e.type) + " " + e.path + "\n");
    out.insert(out.end(), header.begin(), header.end());
    out.insert(out.end(), e.content.begin(), e.content.end());
  }
  return out;
}

// CRIU's pstree.img for a root `pid` and its children: the magics, then u32 size + protobuf per entry.
bytes criu_pstree(const std::vector<std::pair<std::uint32_t, std::uint32_t>>& tasks) {
  bytes out;
  auto u32 = [&](bytes& to, std::uint32_t v) {
    for (int i = 0; i < 4; ++i) to.push_back(static_cast<unsigned char>(v >> (8 * i)));
  };
  auto varint = [](bytes& to, std::uint64_t v) {
    do {
      to.push_back(static_cast<unsigned char>((v & 0x7f) | (v > 0x7f ? 0x80 : 0)));
      v >>= 7;
    } while (v != 0);
  };
  u32(out, 0x54564319);
  u32(out, 0x50273030);
  for (const auto& [pid, ppid] : tasks) {
    bytes m;
    for (const auto& [field, value] :
         {std::pair{1u, pid}, std::pair{2u, ppid}, std::pair{3u, pid}, std::pair{4u, pid}}) {
      m.push_back(static_cast<unsigned char>(field << 3));
      varint(m, value);
    }
    u32(out, static_cast<std::uint32_t>(m.size()));
    out.insert(out.end(), m.begin(), m.end());
  }
  return out;
}

// A whole-process image of process 4242 whose GPU part is `gpu` (an image written above), and near-misses of
// it: hostile numbers, links, FIFOs, files that do not match process.json.
void process_seeds(const fs::path& out, const image_files& gpu, const std::string& image_id) {
  fs::create_directories(out / "process");
  const bytes pstree = criu_pstree({{4242, 0}, {4243, 4242}});
  const bytes pages = pattern(3000, 77), inventory = pattern(40, 78);
  auto criu_file = [](const std::string& name, const bytes& b) {
    char sum[17];
    std::snprintf(sum, sizeof sum, "%016llx", static_cast<unsigned long long>(XXH3_64bits(b.data(), b.size())));
    return ojson{{"name", name}, {"bytes", b.size()}, {"checksum", sum}};
  };
  ojson good = {{"format", "vmmckpt-process"},
                {"version", 1},
                {"tool_version", "0.1.0"},
                {"created", "2026-11-26T10:00:00Z"},
                {"host", "node-7"},
                {"root_pid", 4242},
                {"criu_version", "4.1.1"},
                {"gpu_bytes", gpu.decoded.data_bytes},
                {"stopped_seconds", 1.25},
                {"left_running", false}};
  good["processes"] = ojson::array({ojson{{"pid", 4242},
                                          {"parent", 1},
                                          {"command", {"./train", "--steps", "9"}},
                                          {"image_id", image_id},
                                          {"driver_checkpointed", true}}});
  good["criu_files"] = ojson::array(
      {criu_file("inventory.img", inventory), criu_file("pages-1.img", pages), criu_file("pstree.img", pstree)});
  const std::vector<process_entry> layout{{'f', "criu/inventory.img", inventory},
                                          {'f', "criu/pages-1.img", pages},
                                          {'f', "criu/pstree.img", pstree},
                                          {'d', "gpu/4242", {}},
                                          {'f', "gpu/4242/manifest.json", gpu.manifest},
                                          {'f', "gpu/4242/tables.bin", gpu.tables},
                                          {'f', "gpu/4242/data.bin", gpu.data},
                                          {'f', "criu-dump.status", to_bytes("0\n")}};
  auto seed = [&](const std::string& name, const ojson& manifest, std::vector<process_entry> entries) {
    write_file(out / "process" / name, process_input(manifest.dump(2) + "\n", entries));
  };
  seed("good", good, layout);
  // dump --process --pre-copy (version 2): the pre-copied part gpu/4242.pre beside gpu/4242.
  ojson pre_copied = good;
  pre_copied["version"] = 2;
  pre_copied["processes"][0]["pre_copy_image_id"] = image_id;
  auto pre_layout = layout;
  pre_layout.insert(pre_layout.end(), {{'d', "gpu/4242.pre", {}},
                                       {'f', "gpu/4242.pre/manifest.json", gpu.manifest},
                                       {'f', "gpu/4242.pre/tables.bin", gpu.tables},
                                       {'f', "gpu/4242.pre/data.bin", gpu.data}});
  seed("good-pre-copied", pre_copied, pre_layout);
  pre_copied["version"] = 1;
  seed("near-miss-pre-copied-version-1", pre_copied, pre_layout);
  seed("near-miss-pre-copied-not-named", good, pre_layout);
  auto edited = [&](const std::string& name, void (*edit)(ojson&)) {
    ojson j = good;
    edit(j);
    seed(name, j, layout);
  };
  edited("near-miss-pid-2-32", [](ojson& j) { j["processes"][0]["pid"] = (1ULL << 32) + 4242; });
  edited("near-miss-root-negative", [](ojson& j) { j["root_pid"] = -4242; });
  edited("near-miss-bytes-negative", [](ojson& j) { j["criu_files"][1]["bytes"] = -1; });
  edited("near-miss-bytes-float", [](ojson& j) { j["gpu_bytes"] = 1e30; });
  edited("near-miss-version-float", [](ojson& j) { j["version"] = 1.5; });
  edited("near-miss-name-dotdot", [](ojson& j) { j["criu_files"][0]["name"] = "../process.json"; });
  edited("near-miss-image-id", [](ojson& j) { j["processes"][0]["image_id"] = "another"; });
  edited("near-miss-root-not-criu", [](ojson& j) { j["root_pid"] = 4244; });
  auto with_layout = [&](const std::string& name, std::vector<process_entry> entries) { seed(name, good, entries); };
  auto replaced = [&](std::size_t k, process_entry e) {
    auto l = layout;
    l[k] = std::move(e);
    return l;
  };
  with_layout("near-miss-link-kmsg", replaced(1, {'l', "criu/pages-1.img", to_bytes("/proc/kmsg")}));
  with_layout("near-miss-link-shadow", replaced(1, {'l', "criu/pages-1.img", to_bytes("/etc/shadow")}));
  with_layout("near-miss-fifo", replaced(0, {'p', "criu/inventory.img", {}}));
  with_layout("near-miss-gpu-link", replaced(3, {'l', "gpu/4242", to_bytes("/tmp")}));
  with_layout("near-miss-bigger", replaced(1, {'f', "criu/pages-1.img", pattern(3001, 77)}));
  auto extra = layout;
  extra.push_back({'f', "criu/extra.img", to_bytes("x")});
  with_layout("near-miss-extra-file", extra);
  // No process.json text: the link is what is there.
  auto linked_manifest = layout;
  linked_manifest.push_back({'l', "process.json", to_bytes("/proc/kmsg")});
  write_file(out / "process" / "near-miss-process-json-link", process_input("", linked_manifest));
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  seed_writer seeds{argv[1]};
  fs::create_directories(seeds.out / "image");
  fs::create_directories(seeds.out / "manifest");
  char tmpl[] = "/tmp/vmmckpt-make-seeds-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
  const fs::path scratch = tmpl;

  // Valid images, from the smallest to one with several pools, allocations and extents.
  const image_files empty = write_image(scratch, "empty", base_manifest({"./app"}, 1), {});
  const image_files one =
      write_image(scratch, "one", base_manifest({"./app", "--steps", "100"}, 1),
                  {{0, base0, 512 * gran, {{base0, 4096, vmmckpt::alloc_api::cuda_malloc}}, {{base0, 4096}}}});
  // Pools lie as a process's do, device d's at base0 + d * size (image::validate), and every allocation
  // is wholly in the image.
  constexpr std::uint64_t size = 512 * gran;
  const image_files two_pools =
      write_image(scratch, "two-pools", base_manifest({"python3", "train.py", "--lr=3e-4"}, 2),
                  {{0,
                    base0,
                    size,
                    {{base0, 3000, vmmckpt::alloc_api::cuda_malloc},
                     {base0 + gran, 5000, vmmckpt::alloc_api::cu_mem_alloc},
                     {base0 + 2 * gran, 100, vmmckpt::alloc_api::cuda_malloc_async}},
                    {{base0, 1000}, {base0 + 1000, 2000}, {base0 + gran, 5000}, {base0 + 2 * gran, 100}}},
                   {1,
                    base0 + size,
                    size,
                    {{base0 + size, 1, vmmckpt::alloc_api::cuda_malloc},
                     {base0 + size + gran, 8192, vmmckpt::alloc_api::cuda_malloc_pitch}},
                    {{base0 + size, 1}, {base0 + size + gran, 8192}}}});
  // A device without a pool, pools not in device order, odd command bytes.
  const image_files sparse = write_image(
      scratch, "sparse", base_manifest({"./app", "caf\xc3\xa9", "", "\xe2\x82\xac"}, 3),
      {{2,
        base0 + 2 * size,
        size,
        {{base0 + 2 * size, gran, vmmckpt::alloc_api::cuda_malloc},
         {base0 + 2 * size + gran, 2 * gran, vmmckpt::alloc_api::cuda_malloc}},
        {{base0 + 2 * size, gran}, {base0 + 2 * size + gran, 777}, {base0 + 2 * size + gran + 777, 2 * gran - 777}}},
       {0, base0, size, {{base0, 64, vmmckpt::alloc_api::cuda_malloc}}, {{base0, 64}}}});

  // The same two pools, their extents spread over three data files, as parallel dumps write them.
  const image_files striped =
      write_image(scratch, "striped", base_manifest({"python3", "train.py"}, 2),
                  {{0,
                    base0,
                    size,
                    {{base0, 3000, vmmckpt::alloc_api::cuda_malloc},
                     {base0 + gran, 5000, vmmckpt::alloc_api::cu_mem_alloc},
                     {base0 + 2 * gran, 100, vmmckpt::alloc_api::cuda_malloc_async}},
                    {{base0, 1000}, {base0 + 1000, 2000}, {base0 + gran, 5000}, {base0 + 2 * gran, 100}}},
                   {1,
                    base0 + size,
                    size,
                    {{base0 + size, 1, vmmckpt::alloc_api::cuda_malloc},
                     {base0 + size + gran, 8192, vmmckpt::alloc_api::cuda_malloc_pitch}},
                    {{base0 + size, 1}, {base0 + size + gran, 8192}}}},
                  3);

  // Small allocations with gaps between them, stored as one extent, as dumps store them.
  const image_files packed = write_image(scratch, "packed", base_manifest({"./many-small"}, 1),
                                         {{0,
                                           base0,
                                           size,
                                           {{base0, 100, vmmckpt::alloc_api::cuda_malloc},
                                            {base0 + 512, 300, vmmckpt::alloc_api::cuda_malloc},
                                            {base0 + 4096, 2000, vmmckpt::alloc_api::cu_mem_alloc}},
                                           {{base0, 4096 + 2000, 2400}}}});

  for (const auto& [name, f] : {std::pair{"empty", &empty},
                                {"one", &one},
                                {"two-pools", &two_pools},
                                {"sparse", &sparse},
                                {"striped", &striped},
                                {"packed", &packed}}) {
    seeds.image(name, f->manifest, f->tables, f->data);
    seeds.manifest(name, to_bytes(img::to_json(f->decoded) + "\n"));
  }

  // An incremental image and its parent: two pools, one extent changed; and the parent missing,
  // replaced, edited, or damaged where the child reads it.
  {
    const std::vector<planned_pool> chain_pools = {
        {0,
         base0,
         size,
         {{base0, 3000, vmmckpt::alloc_api::cuda_malloc}, {base0 + gran, 5000, vmmckpt::alloc_api::cu_mem_alloc}},
         {{base0, 1000}, {base0 + 1000, 2000}, {base0 + gran, 5000}}},
        {1, base0 + size, size, {{base0 + size, 700, vmmckpt::alloc_api::cuda_malloc}}, {{base0 + size, 700}}}};
    const image_files parent = write_image(scratch, "parent", base_manifest({"./train"}, 2), chain_pools);
    const image_files child = write_child(scratch, "child", base_manifest({"./train"}, 2), chain_pools, 1);
    write_file(seeds.out / "image" / "chain", chain_input(child, parent));
    seeds.manifest("chain", to_bytes(img::to_json(child.decoded) + "\n"));
    write_file(seeds.out / "image" / "near-miss-chain-parent-missing",
               fuzz_input(child.manifest, child.tables, child.data));
    write_file(seeds.out / "image" / "near-miss-chain-parent-replaced", chain_input(child, one));
    image_files edited = parent;
    {
      ojson j = ojson::parse(parent.manifest.begin(), parent.manifest.end());
      j["host"] = "node-8";
      edited.manifest = to_bytes(j.dump(2) + "\n");
      edited.data = with_headers_for(parent.data, edited.manifest, img::format_version);
    }
    write_file(seeds.out / "image" / "near-miss-chain-parent-edited", chain_input(child, edited));
    image_files damaged = parent;
    damaged.data[64 + 5] ^= 1;  // extent 0, which the child takes from its parent
    write_file(seeds.out / "image" / "near-miss-chain-parent-damaged", chain_input(child, damaged));
    seeds.count += 5;
  }

  // Near-misses in the data file: each is refused for one reason (open or verify_data).
  {
    bytes d = two_pools.data;
    d.pop_back();
    seeds.image("near-miss-data-truncated", two_pools.manifest, two_pools.tables, d);
    d = two_pools.data;
    d.push_back(0);
    seeds.image("near-miss-data-trailing-byte", two_pools.manifest, two_pools.tables, d);
    d = two_pools.data;
    d[40] = 1;
    seeds.image("near-miss-data-reserved-byte", two_pools.manifest, two_pools.tables, d);
    d = two_pools.data;
    d[12] = 2;
    seeds.image("near-miss-data-newer-version", two_pools.manifest, two_pools.tables, d);
    d = two_pools.data;
    d[64 + 1500] ^= 0x40;
    seeds.image("near-miss-data-flipped-bit", two_pools.manifest, two_pools.tables, d);
    seeds.image("near-miss-data-missing-header", two_pools.manifest, two_pools.tables, {});
    // A manifest changed after writing, still valid: open() takes it, verify_data() must not.
    bytes m = two_pools.manifest;
    const std::string was = "\"hold_us\": 1234", now = "\"hold_us\": 1235";
    const auto at = std::search(m.begin(), m.end(), was.begin(), was.end());
    if (at == m.end()) throw std::runtime_error("hold_us not found in the manifest");
    std::copy(now.begin(), now.end(), at);
    seeds.image("near-miss-manifest-changed", m, two_pools.tables, two_pools.data);
  }

  // Near-misses in the manifest: each breaks one rule of docs/image-format.md.
  seeds.edited("near-miss-format-4", one, [](ojson& j) { j["format"] = 4; });
  seeds.edited_tables("near-miss-format-1-with-files", striped, [](ojson& j) { j["format"] = 1; });
  seeds.edited_tables("near-miss-file-index", striped, [](ojson& j) { j["pools"][0]["extents"][1]["file"] = 3; });
  seeds.edited_tables("near-miss-file-offset", striped, [](ojson& j) { j["pools"][0]["extents"][3]["offset"] = 0; });
  seeds.edited("near-miss-data-files", striped, [](ojson& j) { j["data_files"] = 2; });
  seeds.edited("near-miss-image-id", one, [](ojson& j) { j["image_id"] = "not hex"; });
  seeds.edited("near-miss-allocation-count", two_pools, [](ojson& j) { j["pools"][0]["allocation_count"] = 4; });
  seeds.edited("near-miss-tables-checksum", two_pools, [](ojson& j) { j["tables"]["checksum"] = "0123456789abcdef"; });
  seeds.edited_binary_tables("near-miss-tables-truncated", two_pools, [](bytes& t) { t.pop_back(); });
  seeds.edited_binary_tables("near-miss-tables-reserved-byte", two_pools, [](bytes& t) { t[64 + 20] = 1; });
  seeds.edited_binary_tables("near-miss-tables-api", two_pools, [](bytes& t) { t[64 + 16] = 42; });
  seeds.edited_binary_tables("near-miss-tables-magic", two_pools, [](bytes& t) { t[0] = 'X'; });
  // The packed extent's stored bytes, one too many for its allocations (header, 3 allocations, then stored).
  seeds.edited_binary_tables("near-miss-tables-stored", packed, [](bytes& t) { t[64 + 3 * 24 + 16] += 1; });
  {
    // Data files swapped: each header names its own index.
    const auto starts = file_starts(striped.data);
    bytes d(striped.data.begin(), striped.data.begin() + static_cast<std::ptrdiff_t>(starts[1]));
    const bytes file1(striped.data.begin() + static_cast<std::ptrdiff_t>(starts[1]),
                      striped.data.begin() + static_cast<std::ptrdiff_t>(starts[2] - file_separator.size()));
    const bytes file2(striped.data.begin() + static_cast<std::ptrdiff_t>(starts[2]), striped.data.end());
    d.insert(d.end(), file2.begin(), file2.end());
    d.insert(d.end(), file_separator.begin(), file_separator.end());
    d.insert(d.end(), file1.begin(), file1.end());
    seeds.image("near-miss-files-swapped", striped.manifest, striped.tables, d);
    // A data file missing.
    seeds.image("near-miss-file-missing", striped.manifest, striped.tables,
                bytes(striped.data.begin(),
                      striped.data.begin() + static_cast<std::ptrdiff_t>(starts[2] - file_separator.size())));
  }
  seeds.edited_tables("near-miss-checksum", two_pools,
                      [](ojson& j) { j["pools"][0]["extents"][1]["checksum"] = "0123456789abcdef"; });
  seeds.edited_tables("near-miss-overlap", two_pools,
                      [](ojson& j) { j["pools"][0]["extents"][1]["addr"] = "0x2000000003e7"; });
  seeds.edited_tables("near-miss-offset", two_pools, [](ojson& j) { j["pools"][1]["extents"][0]["offset"] = 7099; });
  seeds.edited_tables("near-miss-two-allocations", two_pools,
                      [](ojson& j) { j["pools"][0]["extents"][3]["size"] = 2 * gran; });
  seeds.edited("near-miss-address-17-digits", one, [](ojson& j) { j["pools"][0]["base"] = "0x10000000000000000"; });
  seeds.edited_tables("near-miss-negative-size", one, [](ojson& j) { j["pools"][0]["allocations"][0]["size"] = -1; });
  seeds.edited_tables("near-miss-float-size", one, [](ojson& j) { j["pools"][0]["extents"][0]["size"] = 4096.0; });
  seeds.edited("near-miss-pool-overflow", one, [](ojson& j) { j["pools"][0]["base"] = "0xffffffffffe00000"; });
  seeds.edited("near-miss-unknown-device", sparse, [](ojson& j) { j["pools"][1]["device"] = 9; });
  seeds.edited_tables("near-miss-missing-field", two_pools,
                      [](ojson& j) { j["pools"][1]["extents"][1].erase("checksum"); });
  seeds.edited("near-miss-data-bytes", two_pools, [](ojson& j) { j["data_bytes"] = 18446744073709551615ULL; });
  {
    // Nesting one level past the limit, in an ignored field.
    std::string deep = "{\"magic\": \"vmmckpt-image\", \"format\": 1, \"x\": ";
    for (int i = 0; i < 17; ++i) deep += "[";
    for (int i = 0; i < 17; ++i) deep += "]";
    deep += "}\n";
    seeds.manifest("near-miss-deep", to_bytes(deep));
    seeds.image("near-miss-deep", to_bytes(deep), empty.tables, empty.data);
  }

  process_seeds(seeds.out, one, one.decoded.image_id);
  seeds.count += 16;

  std::error_code ec;
  fs::remove_all(scratch, ec);
  std::printf("make_seeds: wrote %d files under %s\n", seeds.count, seeds.out.c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "make_seeds: %s\n", e.what());
  return 1;
}
