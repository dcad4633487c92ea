// The cut's arithmetic: targets from the ranks' counts, and whether a rank stands at them.
#include "job/cut_plan.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "vmmckpt/support/hex_text.hpp"

namespace vmmckpt::ckpt {
namespace {

std::uint64_t count_for(const std::vector<control::peer_count>& counts, int peer) {
  for (const auto& c : counts)
    if (c.peer == peer) return c.count;
  return 0;
}

// Counts of a pair of ranks of one communicator: (id, sender, receiver).
using pair_key = std::tuple<std::uint64_t, int, int>;

}  // namespace

std::vector<std::vector<control::comm_count>> cut_targets(const std::vector<control::cut_status>& ranks) {
  std::map<std::uint64_t, std::uint64_t> collectives;
  std::map<pair_key, std::uint64_t> pairs;
  for (const auto& r : ranks)
    for (const auto& c : r.comms) {
      collectives[c.id] = std::max(collectives[c.id], c.ops);
      for (const auto& s : c.sends) pairs[{c.id, c.rank, s.peer}] = std::max(pairs[{c.id, c.rank, s.peer}], s.count);
      for (const auto& v : c.recvs) pairs[{c.id, v.peer, c.rank}] = std::max(pairs[{c.id, v.peer, c.rank}], v.count);
    }
  std::vector<std::vector<control::comm_count>> out;
  out.reserve(ranks.size());
  for (const auto& r : ranks) {
    std::vector<control::comm_count> targets;
    for (const auto& c : r.comms) {
      control::comm_count t{c.id, c.rank, 0, collectives[c.id], {}, {}};
      for (const auto& [key, n] : pairs) {
        const auto& [id, from, to] = key;
        if (id != c.id) continue;
        if (from == c.rank) t.sends.push_back({to, n});
        if (to == c.rank) t.recvs.push_back({from, n});
      }
      std::sort(t.recvs.begin(), t.recvs.end(), [](const auto& a, const auto& b) { return a.peer < b.peer; });
      targets.push_back(std::move(t));
    }
    out.push_back(std::move(targets));
  }
  return out;
}

bool at_cut(const control::cut_status& rank, const std::vector<control::comm_count>& targets) {
  if (!rank.armed || rank.in_flight != 0) return false;  // a rank whose arming lapsed holds nothing back
  for (const auto& t : targets)
    for (const auto& c : rank.comms) {
      if (c.id != t.id || c.rank != t.rank) continue;
      if (c.ops != t.ops) return false;
      for (const auto& s : t.sends)
        if (count_for(c.sends, s.peer) != s.count) return false;
      for (const auto& v : t.recvs)
        if (count_for(c.recvs, v.peer) != v.count) return false;
    }
  return true;
}

std::string against_targets(const control::cut_status& rank, const std::vector<control::comm_count>& targets) {
  std::string text = !rank.where.empty()  ? "waiting in " + rank.where
                     : rank.in_flight > 0 ? "inside an NCCL call (" + std::to_string(rank.in_flight) + " under way)"
                                          : "not at an NCCL call (in a long kernel, or busy or blocked elsewhere)";
  for (const auto& t : targets)
    for (const auto& c : rank.comms) {
      if (c.id != t.id || c.rank != t.rank) continue;
      std::string behind;
      if (c.ops < t.ops) behind += std::to_string(c.ops) + " of " + std::to_string(t.ops) + " collectives";
      for (const auto& s : t.sends)
        if (const auto n = count_for(c.sends, s.peer); n < s.count)
          behind += (behind.empty() ? "" : ", ") + std::to_string(n) + " of " + std::to_string(s.count) +
                    " sends to rank " + std::to_string(s.peer);
      for (const auto& v : t.recvs)
        if (const auto n = count_for(c.recvs, v.peer); n < v.count)
          behind += (behind.empty() ? "" : ", ") + std::to_string(n) + " of " + std::to_string(v.count) +
                    " receives from rank " + std::to_string(v.peer);
      if (!behind.empty()) text += "; communicator " + hex(c.id) + " (rank " + std::to_string(c.rank) + "): " + behind;
    }
  return text;
}

std::string missing_members(const std::vector<control::cut_status>& ranks) {
  std::map<std::uint64_t, std::pair<int, std::set<int>>> members;  // id -> (size, ranks seen)
  for (const auto& r : ranks)
    for (const auto& c : r.comms) {
      auto& [size, seen] = members[c.id];
      size = std::max(size, c.size);
      seen.insert(c.rank);
    }
  for (const auto& [id, m] : members)
    if (static_cast<int>(m.second.size()) < m.first)
      return "communicator " + hex(id) + " has " + std::to_string(m.first) + " ranks, of which only " +
             std::to_string(m.second.size()) +
             " are processes of this job: its other ranks run elsewhere (on another node, or are not named by "
             "--ranks), and a cut of part of it cannot hold";
  return {};
}

}  // namespace vmmckpt::ckpt
