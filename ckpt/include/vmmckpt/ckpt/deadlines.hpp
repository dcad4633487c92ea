// How long the tool's operations may take: the defaults of --deadline and the tool's other waits, and the one
// deadline type every step of an operation is given, so that each takes what is left of the whole.
#pragma once

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>

#include "vmmckpt/protocol/control_messages.hpp"

namespace vmmckpt::ckpt {

// How long an operation may hold the program (--deadline): connecting, preparing and the hold itself.
inline constexpr std::chrono::seconds default_dump_hold{60};  // dump, and a job's dump
// Suspend holds the program until its image is complete and checked, which takes longer than a dump's copy.
inline constexpr std::chrono::seconds default_suspend_hold{120};
// How long `cuda-ckpt resume` (and resume --job) waits for the program (--deadline): a resume that loads tens of
// GiB from a slow disk needs a longer one.
inline constexpr std::chrono::seconds default_resume_deadline{120};
// The resume that ends a restore (or a dump's way back), which waits for the new process to load its image.
inline constexpr std::chrono::minutes restore_resume_deadline{10};
// One connection to a process that no operation gives a deadline of its own (cuda-ckpt check).
inline constexpr std::chrono::seconds control_deadline{30};
// The most a job's members are waited for when they are listed: one that does not answer (stopped) fails the
// command early, within its deadline.
inline constexpr std::chrono::seconds member_wait{10};
// member_wait, or an operation's whole deadline when that is shorter.
inline std::chrono::milliseconds member_wait_within(std::chrono::milliseconds whole) {
  return std::min<std::chrono::milliseconds>(member_wait, whole);
}

// A point on the steady clock by which something must be done. Every step of an operation is handed the one
// deadline and takes what is left of it, in the form it needs.
class deadline {
 public:
  using clock = std::chrono::steady_clock;

  explicit deadline(clock::time_point at) : at_(at) {}
  // `within` from now.
  static deadline in(clock::duration within) { return deadline(clock::now() + within); }

  clock::time_point at() const { return at_; }
  bool expired() const { return clock::now() >= at_; }
  // What is left, zero once it passed.
  std::chrono::milliseconds remaining() const {
    return std::max(std::chrono::milliseconds(0),
                    std::chrono::duration_cast<std::chrono::milliseconds>(at_ - clock::now()));
  }
  // What is left in whole milliseconds, for a poll() or a message, kept within [at_least, at_most].
  int remaining_ms(int at_least, int at_most = INT_MAX) const {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(at_ - clock::now()).count();
    return static_cast<int>(std::clamp<long long>(left, at_least, at_most));
  }
  // The wire form of the control channel's requests (valid_until_ms): the deadline on the wall clock, in
  // milliseconds since the epoch, at least a millisecond ahead so that no request is sent already void.
  std::int64_t valid_until_ms() const { return control::unix_ms_now() + remaining_ms(1); }

  friend bool operator<(const deadline& a, const deadline& b) { return a.at_ < b.at_; }

 private:
  clock::time_point at_;
};

}  // namespace vmmckpt::ckpt
