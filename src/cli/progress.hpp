// The progress line of long runs, on rank 0's stderr: the phase (setup, forward, backward,
// check, writing), the iteration, the ring step the engine last reported, the time elapsed
// and an estimate of what is left. On a terminal one line redrawn in place; into a log
// (--progress) whole lines, never a carriage return. Other ranks make none.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <iosfwd>
#include <mutex>
#include <string>
#include <thread>

namespace ringattn::cli {

enum class ProgressMode { off, terminal, lines };

// --quiet: off; --progress: lines (a terminal keeps its redrawn line); otherwise a
// terminal gets the redrawn line and anything else nothing.
ProgressMode progress_mode(bool forced, bool quiet, bool stderr_is_terminal);

// How often it writes (said in `ringattn run --help`).
inline constexpr double kTerminalRedrawSeconds = 0.25;  // at most 4 redraws a second
inline constexpr double kLinesMinGapSeconds = 1;        // a line per step, at most 1 a second
inline constexpr double kLinesHeartbeatSeconds = 30;    // and one at least this often
// Until a backward has been timed, its time is estimated as this many forwards: the
// FlashAttention-2 backward does about 2.5 times the forward's matrix products.
inline constexpr double kBackwardPerForward = 2.5;

class ProgressReporter {
 public:
  // `iterations`: forward calls the run makes (warmup included), each followed by a
  // backward when `backward`. RINGATTN_PROGRESS_INTERVAL=SECONDS replaces the lines
  // mode's minimum gap (tests use 0: a line at every change).
  ProgressReporter(ProgressMode mode, int iterations, int warmup, bool backward, std::ostream& err);
  ~ProgressReporter();
  ProgressReporter(const ProgressReporter&) = delete;
  ProgressReporter& operator=(const ProgressReporter&) = delete;

  bool on() const { return mode_ != ProgressMode::off; }
  // The ring engines' hook (RingOptions::on_step); empty when off.
  std::function<void(int, int)> step_hook();
  // A forward or backward call of iteration `iteration` (0-based) starts or ends.
  void begin_call(bool backward_call, int iteration);
  void end_call();
  // A phase after the timed calls ("check", "writing"): one line each in lines mode.
  void phase(const std::string& name);
  // Clears the terminal line and stops; before anything else is printed. Idempotent.
  void finish();

 private:
  using Clock = std::chrono::steady_clock;
  void on_step(int done, int steps);
  std::string line_locked(Clock::time_point now) const;
  void emit_locked(Clock::time_point now);
  double estimate_call_locked(bool backward_call, double current_estimate) const;
  void tick();

  ProgressMode mode_;
  int iterations_, warmup_;
  bool backward_;
  double min_gap_s_ = kLinesMinGapSeconds;
  std::ostream& err_;

  std::mutex mu_;  // the hook (rank 0's driving thread) and the ticker share the state
  std::condition_variable wake_;
  bool stopped_ = false;
  std::string phase_ = "setup";
  bool in_call_ = false, backward_call_ = false;
  int iteration_ = -1;
  int step_ = 0, steps_ = 0;
  Clock::time_point start_, call_start_, last_line_;
  bool changed_ = false;  // since the last line
  double fwd_sum_s_ = 0, bwd_sum_s_ = 0;
  int fwd_n_ = 0, bwd_n_ = 0;
  std::thread ticker_;
};

}  // namespace ringattn::cli
