// libvmmckpt.so exports only the intercepted names and depends on nothing but glibc and libstdc++.
#include <catch2/catch.hpp>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "process.hpp"

using vmmckpt::test::run_process;

namespace {

const std::string shim = std::string(VMMCKPT_BUILD_DIR) + "/lib/libvmmckpt.so";

std::set<std::string> lines_of(const std::string& text) {
  std::set<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.insert(line);
  return out;
}

std::string read_file(const char* path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The names the shim means to export: those listed by name under `global:` in
// the version script (its wildcards are for the gated list), and the gated
// entry points of gated_entry_points.inc.
std::set<std::string> intended_exports() {
  const std::string map = read_file(VMMCKPT_VERSION_SCRIPT);
  const auto begin = map.find("global:");
  const auto end = map.find("local:");
  std::string body = map.substr(begin + 7, end - begin - 7);
  body = std::regex_replace(body, std::regex(R"(/\*[^*]*\*/)"), " ");
  std::set<std::string> names;
  const std::regex entry(R"(([A-Za-z_][A-Za-z0-9_]*)(\*?);)");
  for (auto it = std::sregex_iterator(body.begin(), body.end(), entry); it != std::sregex_iterator(); ++it)
    if ((*it)[2].length() == 0) names.insert((*it)[1].str());
  const std::string gated = read_file(VMMCKPT_GATED_LIST);
  const std::regex gated_entry(R"(VMMCKPT_GATED\((\w+),)");
  for (auto it = std::sregex_iterator(gated.begin(), gated.end(), gated_entry); it != std::sregex_iterator(); ++it)
    names.insert((*it)[1].str());
  return names;
}

}  // namespace

TEST_CASE("the shim exports exactly the intercepted symbols", "[emu][hygiene]") {
  const auto r = run_process({"sh", "-c", "nm -D --defined-only '" + shim + "' | awk '{print $3}'"});
  REQUIRE(r.exit_code == 0);
  const auto exported = lines_of(r.out);
  const auto expected = intended_exports();
  REQUIRE(expected.size() > 150);
  REQUIRE(exported == expected);
  for (const auto& name : exported) {
    INFO(name);
    REQUIRE(name.find("spdlog") == std::string::npos);
    REQUIRE(name.find("fmt") == std::string::npos);
  }
}

TEST_CASE("the shim links neither libcuda, libcudart, spdlog nor fmt", "[emu][hygiene]") {
  const auto r = run_process({"sh", "-c", "readelf -d '" + shim + "' | sed -n 's/.*NEEDED.*\\[\\(.*\\)\\]/\\1/p'"});
  REQUIRE(r.exit_code == 0);
  const std::set<std::string> allowed = {"libc.so.6", "libstdc++.so.6", "libgcc_s.so.1", "libm.so.6",
                                         "ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1", "libdl.so.2",
                                         "libpthread.so.0"};
  const auto needed = lines_of(r.out);
  REQUIRE_FALSE(needed.empty());
  for (const auto& lib : needed) {
    INFO(lib);
    // A sanitized build (scripts/sanitize.sh) needs its sanitizer runtimes too.
    REQUIRE((allowed.count(lib) == 1 || lib.rfind("libasan.so", 0) == 0 || lib.rfind("libubsan.so", 0) == 0));
  }
  // And no undefined CUDA symbol waits for a library to provide it.
  const auto undefined = run_process({"sh", "-c", "nm -D --undefined-only '" + shim + "' | grep -c ' cu' || true"});
  REQUIRE(undefined.out == "0\n");
}
