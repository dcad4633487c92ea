// `cuda-ckpt peek` and `poke`: the CPU's window into a live program's GPU memory (docs/peek.md). The engine is
// ckpt/peek.hpp; this is the command line and the views of the bytes (peek_view.hpp).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <nlohmann/json.hpp>

#include "byte_sink.hpp"
#include "cli_options.hpp"
#include "commands.hpp"
#include "exit_codes.hpp"
#include "interrupts.hpp"
#include "output.hpp"
#include "peek_view.hpp"
#include "vmmckpt/ckpt/peek.hpp"
#include "vmmckpt/pool/pool_layout.hpp"
#include "vmmckpt/support/hex_text.hpp"

namespace vmmckpt::tools {
namespace {

using ordered_json = nlohmann::ordered_json;

// A command line that cannot be run: said with the command's name, exit status 2.
struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <typename Run>
int with_usage(const char* command, Run&& run) {
  try {
    return run();
  } catch (const usage_error& e) {
    std::fprintf(stderr, "cuda-ckpt %s: %s\n", command, e.what());
    return exit_usage;
  } catch (const std::invalid_argument& e) {  // peek_view's: a shape or type that does not fit the bytes
    std::fprintf(stderr, "cuda-ckpt %s: %s\n", command, e.what());
    return exit_usage;
  }
}

std::string hex_bytes(const std::string& bytes) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const unsigned char c : bytes) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

struct peek_command_options {
  pid_t pid = 0;
  std::string target, size, output, type, shape, npy, via;
  bool whole_allocation = false, list = false, stats = false, json = false;
  bool live = false, ordered = false, quiesce = false;
  double watch = 0;
  std::uint64_t count = 0;  // --watch's samples; 0: until interrupted
  double deadline_s = std::chrono::duration<double>(ckpt::default_peek_hold).count();
};

// TARGET: an address (0x hex), or a name the program gave a range, then an offset into it (NAME+OFFSET).
void parse_target(const std::string& text, std::uint64_t& addr, std::string& name) {
  if (parse_address(text, addr)) return;
  const auto plus = text.find('+');
  name = text.substr(0, plus);
  addr = 0;
  if (plus != std::string::npos && !parse_size(text.substr(plus + 1), addr))
    throw usage_error("'" + text + "': the offset after + is not a size");
  if (!control::valid_range_name(name))
    throw usage_error("'" + text + "' is neither an address (0x hex) nor a range name (vmmckpt_name)");
}

control::peek_order order_of(bool live, bool ordered, bool quiesce) {
  if (live + ordered + quiesce > 1) throw usage_error("--live, --ordered and --quiesce exclude each other");
  return quiesce ? control::peek_order::quiesce : ordered ? control::peek_order::ordered : control::peek_order::live;
}

std::chrono::milliseconds hold_of(double seconds) {
  if (!(seconds > 0) || seconds > 3600) throw usage_error("--deadline: 0 to 3600 seconds");
  return std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000));
}

ckpt::peek_options engine_options(const peek_command_options& o) {
  ckpt::peek_options p;
  p.pid = o.pid;
  parse_target(o.target, p.addr, p.name);
  if (!o.size.empty() && (!parse_size(o.size, p.size) || p.size == 0))
    throw usage_error("SIZE '" + o.size + "' is not a size of at least 1 (0x hex or decimal, K/M/G/T)");
  if (o.whole_allocation && !o.size.empty()) throw usage_error("--alloc reads the whole allocation: no SIZE");
  // An address alone shows a look at it (256 bytes), not all of a large allocation; a name, the whole range.
  if (o.size.empty() && !o.whole_allocation && o.type.empty() && p.name.empty()) p.size = 256;
  p.order = order_of(o.live, o.ordered, o.quiesce);
  p.hold_deadline = hold_of(o.deadline_s);
  if (o.via == "copy") p.via = control::peek_path::copy;
  if (o.via == "map") p.via = control::peek_path::map;
  if (o.via == "bar")
    throw ckpt::tool_error("--via bar: no way to reach the chunks through the PCIe BAR from user space works on this "
                           "driver; docs/peek.md says what was tried and what each gave");
  return p;
}

// --alloc: the allocation that holds the address, from its start (a second request when the address is inside).
ckpt::peek_result peek_allocation(ckpt::peek_options p) {
  p.size = 0;
  ckpt::peek_result r = ckpt::peek(p);
  if (r.reply.range.addr == r.reply.range.allocation) return r;
  p.addr = r.reply.range.allocation;
  p.name.clear();
  return ckpt::peek(p);
}

std::optional<peek_view::element> element_of(const std::string& type) {
  if (type.empty()) return std::nullopt;
  auto e = peek_view::parse_element(type);
  if (!e) throw usage_error("-t '" + type + "': one of " + peek_view::element_names());
  return e;
}

ordered_json range_json(const ckpt::peek_result& r) {
  const auto& g = r.reply.range;
  ordered_json j{{"addr", hex(g.addr)},
                 {"size", g.size},
                 {"device", g.device},
                 {"allocation", hex(g.allocation)},
                 {"allocation_size", g.allocation_size},
                 {"order", control::name_of(r.reply.order)},
                 {"via", control::name_of(r.reply.via)},
                 {"held_us", r.reply.held_us},
                 {"seconds", r.seconds}};
  if (!g.name.empty()) j["name"] = g.name;
  return j;
}

// One peek shown as asked: raw bytes to -o (or a pipe), an .npy file, values, statistics, a hex dump, JSON.
void show(const peek_command_options& o, const ckpt::peek_result& r, std::optional<peek_view::element> e,
          const std::vector<std::uint64_t>& shape) {
  if (e) peek_view::check_shape(shape, *e, r.bytes.size());
  if (!o.npy.empty()) {
    byte_sink npy(o.npy);
    const std::string file = peek_view::npy_file(*e, shape, r.bytes);
    npy.write(reinterpret_cast<const unsigned char*>(file.data()), file.size());
    npy.commit();
  }
  const bool raw = !o.output.empty() || (!o.json && !e && !o.stats && ::isatty(STDOUT_FILENO) == 0);
  if (raw) {
    byte_sink out(o.output);
    out.write(reinterpret_cast<const unsigned char*>(r.bytes.data()), r.bytes.size());
    out.commit();
    if (o.output.empty()) return;
  }
  if (o.json) {
    ordered_json j = range_json(r);
    if (o.stats) j["stats"] = ordered_json::parse(peek_view::summary_json(peek_view::summarize(*e, r.bytes)));
    if (!raw && r.bytes.size() <= (1u << 20)) j["hex"] = hex_bytes(r.bytes);
    std::cout << j.dump() << '\n';
    return;
  }
  if (raw) return;
  if (o.stats) {
    const auto s = peek_view::summarize(*e, r.bytes);
    std::printf("%llu %s: min %.7g max %.7g mean %.7g, %llu NaN, %llu +Inf, %llu -Inf\n",
                static_cast<unsigned long long>(s.count), std::string(peek_view::name_of(*e)).c_str(), s.min, s.max,
                s.mean, static_cast<unsigned long long>(s.nan), static_cast<unsigned long long>(s.pos_inf),
                static_cast<unsigned long long>(s.neg_inf));
  } else if (e) {
    peek_view::write_values(std::cout, *e, shape, r.bytes);
  } else {
    peek_view::write_hexdump(std::cout, r.reply.range.addr, r.bytes);
  }
  if (r.reply.order == control::peek_order::live)
    std::fprintf(stderr, "(--live: read while the program ran; a kernel may have been writing these bytes)\n");
}

int list_command(const peek_command_options& o) {
  const control::regions_reply regions = ckpt::regions(o.pid);
  if (o.json) {
    ordered_json j{{"pid", o.pid}, {"allocations", ordered_json::array()}, {"names", ordered_json::array()}};
    for (const auto& p : regions.pools)
      for (const auto& a : p.allocations)
        j["allocations"].push_back(
            {{"addr", hex(a.addr)}, {"size", a.size}, {"device", p.device}, {"api", name_of(a.api)}});
    for (const auto& n : regions.names)
      j["names"].push_back({{"name", n.name}, {"addr", hex(n.addr)}, {"size", n.size}});
    std::cout << j.dump() << '\n';
    return exit_ok;
  }
  std::printf("%-18s %14s %6s  %s\n", "ADDR", "SIZE", "DEVICE", "API");
  for (const auto& p : regions.pools)
    for (const auto& a : p.allocations)
      std::printf("%-18s %14llu %6d  %s\n", hex(a.addr).c_str(), static_cast<unsigned long long>(a.size), p.device,
                  std::string(name_of(a.api)).c_str());
  for (const auto& n : regions.names)
    std::printf("name %s: %s, %s\n", n.name.c_str(), hex(n.addr).c_str(), human_bytes(n.size).c_str());
  return exit_ok;
}

int peek_command(const peek_command_options& o) {
  if (o.list) return list_command(o);
  if (o.target.empty()) throw usage_error("peek needs an ADDR or a NAME (or --list)");
  const auto e = element_of(o.type);
  const auto shape = o.shape.empty() ? std::vector<std::uint64_t>{} : peek_view::parse_shape(o.shape);
  if ((o.stats || !o.npy.empty() || !o.shape.empty()) && !e) throw usage_error("--stats, --npy and --shape need -t");
  const ckpt::peek_options p = engine_options(o);
  if (!(o.watch > 0)) {
    show(o, o.whole_allocation ? peek_allocation(p) : ckpt::peek(p), e, shape);
    return exit_ok;
  }
  const auto& interrupted = catch_interrupts();
  for (std::uint64_t sample = 0; (o.count == 0 || sample < o.count) && interrupted.load() == 0; ++sample) {
    if (sample > 0) std::this_thread::sleep_for(std::chrono::duration<double>(o.watch));
    show(o, o.whole_allocation ? peek_allocation(p) : ckpt::peek(p), e, shape);
    std::fflush(stdout);
  }
  return exit_ok;
}

}  // namespace

subcommand add_peek(CLI::App& app) {
  auto o = std::make_shared<peek_command_options>();
  auto* c = app.add_subcommand("peek", "Read a live program's GPU memory, without stopping it");
  c->add_option("pid", o->pid, "The program (under vmmckpt)")->required()->type_name("PID");
  c->add_option("target", o->target, "An address (0x hex), or a range the program named (NAME or NAME+OFFSET)")
      ->type_name("ADDR|NAME");
  c->add_option("size", o->size,
                "Bytes (0x hex or decimal, K/M/G/T); default 256 at an address, all of a name or with -t")
      ->type_name("SIZE");
  c->add_option("-o,--output", o->output, "Write the raw bytes to this file (created 0600, only when complete)")
      ->type_name("FILE");
  c->add_flag("--alloc", o->whole_allocation, "The whole allocation that holds ADDR");
  c->add_flag("--list", o->list, "List the program's allocations and named ranges");
  c->add_option("-t,--type", o->type, "Show values of this type: " + peek_view::element_names())->type_name("TYPE");
  c->add_option("--shape", o->shape, "Dimensions of the values, e.g. 4,1024 (the last one per line)")
      ->type_name("DIMS");
  c->add_flag("--stats", o->stats, "Min, max, mean and NaN/Inf counts of the values (-t)");
  c->add_option("--npy", o->npy, "Write the values (-t, --shape) as a NumPy .npy file")->type_name("FILE");
  c->add_flag("--json", o->json, "Print the range, how it was read and (up to 1 MiB) its bytes as JSON");
  c->add_option("--watch", o->watch, "Peek again every SEC seconds until Ctrl-C (or --count)")->type_name("SEC");
  c->add_option("--count", o->count, "With --watch: this many samples")->type_name("N");
  c->add_flag("--live", o->live, "Read while the program runs (the default; unordered with its kernels)");
  c->add_flag("--ordered", o->ordered, "Read after the work the program has already submitted");
  c->add_flag("--quiesce", o->quiesce, "Hold the program at the dump's gate for the copy alone");
  c->add_option("--deadline", o->deadline_s, "--quiesce: the longest the program may be held, in seconds (10)")
      ->type_name("S");
  c->add_option("--via", o->via, "copy (no CUDA here), map (bulk: this tool maps the memory), bar")
      ->check(CLI::IsMember({"copy", "map", "bar"}))
      ->type_name("PATH");
  c->footer("Usage: cuda-ckpt peek PID ADDR|NAME [SIZE] [-o FILE] [-t TYPE [--shape DIMS] [--stats] [--npy FILE]]\n"
            "       cuda-ckpt peek PID --list\n"
            "Only memory vmmckpt owns is read: an address outside it exits 1 naming it, and nothing is written.\n"
            "On a terminal the bytes are shown as a hex dump; to a pipe or with -o they are written raw.");
  return {c, [o] { return with_usage("peek", [&] { return peek_command(*o); }); }};
}

namespace {

struct poke_command_options {
  pid_t pid = 0;
  std::string target, file;
  bool yes = false, live = false, ordered = false, quiesce = false, json = false;
  double deadline_s = std::chrono::duration<double>(ckpt::default_peek_hold).count();
};

std::string read_all(const std::string& path) {
  std::ifstream in;
  std::istream* from = &std::cin;
  if (path != "-") {
    in.open(path, std::ios::binary);
    if (!in) throw ckpt::tool_error(path + ": cannot open");
    from = &in;
  }
  std::string bytes((std::istreambuf_iterator<char>(*from)), std::istreambuf_iterator<char>());
  return bytes;
}

int poke_command(const poke_command_options& o) {
  if (!o.yes) throw usage_error("poke changes a running program's memory: say --yes (see `cuda-ckpt poke --help`)");
  ckpt::poke_options p;
  p.pid = o.pid;
  parse_target(o.target, p.addr, p.name);
  p.order = o.live || o.ordered ? order_of(o.live, o.ordered, o.quiesce) : control::peek_order::quiesce;
  p.hold_deadline = hold_of(o.deadline_s);
  p.bytes = read_all(o.file);
  const control::poke_reply r = ckpt::poke(p);
  if (o.json) {
    std::cout << ordered_json{{"addr", hex(r.range.addr)}, {"size", r.range.size}, {"held_us", r.held_us}}.dump()
              << '\n';
  } else {
    std::printf("wrote %llu bytes at %s (%s)\n", static_cast<unsigned long long>(r.range.size),
                hex(r.range.addr).c_str(), std::string(control::name_of(p.order)).c_str());
  }
  return exit_ok;
}

}  // namespace

subcommand add_poke(CLI::App& app) {
  auto o = std::make_shared<poke_command_options>();
  auto* c = app.add_subcommand("poke", "Write bytes into a live program's GPU memory");
  c->add_option("pid", o->pid, "The program (under vmmckpt)")->required()->type_name("PID");
  c->add_option("target", o->target, "An address (0x hex), or NAME or NAME+OFFSET")->required()->type_name("ADDR|NAME");
  c->add_option("file", o->file, "The bytes to write (- for stdin)")->required()->type_name("FILE");
  c->add_flag("--yes", o->yes, "Yes, change the program's memory");
  c->add_flag("--quiesce", o->quiesce, "Hold the program at the dump's gate for the write (the default)");
  c->add_flag("--ordered", o->ordered, "Write after the work the program has already submitted, without holding it");
  c->add_flag("--live", o->live, "Write while the program runs");
  c->add_option("--deadline", o->deadline_s, "The longest the program may be held, in seconds (10)")->type_name("S");
  c->add_flag("--json", o->json, "Print what was written as JSON");
  c->footer("Usage: cuda-ckpt poke PID ADDR|NAME FILE --yes\n"
            "Only into memory vmmckpt owns, wholly inside one allocation; the program's owner or root only.");
  return {c, [o] { return with_usage("poke", [&] { return poke_command(*o); }); }};
}

}  // namespace vmmckpt::tools
