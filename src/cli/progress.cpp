// The progress reporter: the engines' hook and the run loop update its state under one
// mutex (a few times per ring step, never inside an OpenMP region); a ticker thread redraws
// the terminal line and writes the log's heartbeat, so a step of minutes still shows time.
#include "cli/progress.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ostream>

namespace ringattn::cli {

namespace {

std::string clock_text(double seconds) {
  const auto s = static_cast<long long>(std::max(0.0, std::round(seconds)));
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  else
    std::snprintf(buf, sizeof buf, "%lld:%02lld", s / 60, s % 60);
  return buf;
}

double seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

ProgressMode progress_mode(bool forced, bool quiet, bool stderr_is_terminal) {
  if (quiet) return ProgressMode::off;
  if (stderr_is_terminal) return ProgressMode::terminal;
  return forced ? ProgressMode::lines : ProgressMode::off;
}

ProgressReporter::ProgressReporter(ProgressMode mode, int iterations, int warmup, bool backward,
                                   std::ostream& err)
    : mode_(mode), iterations_(iterations), warmup_(warmup), backward_(backward), err_(err) {
  start_ = call_start_ = last_line_ = Clock::now();
  if (const char* gap = std::getenv("RINGATTN_PROGRESS_INTERVAL")) {
    char* end = nullptr;
    const double v = std::strtod(gap, &end);
    if (end != gap && v >= 0) min_gap_s_ = v;
  }
  if (mode_ != ProgressMode::off) ticker_ = std::thread([this] { tick(); });
}

ProgressReporter::~ProgressReporter() { finish(); }

std::function<void(int, int)> ProgressReporter::step_hook() {
  if (mode_ == ProgressMode::off) return {};
  return [this](int done, int steps) { on_step(done, steps); };
}

void ProgressReporter::on_step(int done, int steps) {
  std::lock_guard lock(mu_);
  if (stopped_ || (done == step_ && steps == steps_)) return;
  step_ = done;
  steps_ = steps;
  changed_ = true;
  const auto now = Clock::now();
  if (mode_ == ProgressMode::lines && seconds(now - last_line_) >= min_gap_s_) emit_locked(now);
}

void ProgressReporter::begin_call(bool backward_call, int iteration) {
  if (mode_ == ProgressMode::off) return;
  std::lock_guard lock(mu_);
  in_call_ = true;
  backward_call_ = backward_call;
  iteration_ = iteration;
  phase_ = backward_call ? "backward" : "forward";
  step_ = steps_ = 0;
  changed_ = true;
  call_start_ = Clock::now();
  if (mode_ == ProgressMode::lines && !stopped_ && seconds(call_start_ - last_line_) >= min_gap_s_)
    emit_locked(call_start_);
}

void ProgressReporter::end_call() {
  if (mode_ == ProgressMode::off) return;
  std::lock_guard lock(mu_);
  const double took = seconds(Clock::now() - call_start_);
  (backward_call_ ? bwd_sum_s_ : fwd_sum_s_) += took;
  ++(backward_call_ ? bwd_n_ : fwd_n_);
  in_call_ = false;
}

void ProgressReporter::phase(const std::string& name) {
  if (mode_ == ProgressMode::off) return;
  std::lock_guard lock(mu_);
  phase_ = name;
  in_call_ = false;
  step_ = steps_ = 0;
  changed_ = true;
  // At most two of these per run: always written.
  if (mode_ == ProgressMode::lines && !stopped_) emit_locked(Clock::now());
}

void ProgressReporter::finish() {
  {
    std::lock_guard lock(mu_);
    if (stopped_) return;
    stopped_ = true;
    // The cleared line leaves the terminal as the run found it, for the table or an error.
    if (mode_ == ProgressMode::terminal && last_line_ != start_) err_ << "\r\x1b[K" << std::flush;
  }
  wake_.notify_all();
  if (ticker_.joinable()) ticker_.join();
}

// The time a whole call of that kind takes: measured calls of the kind, else the other
// kind scaled by kBackwardPerForward, else the current call's extrapolation (< 0: unknown).
double ProgressReporter::estimate_call_locked(bool backward_call, double current_estimate) const {
  if (backward_call && bwd_n_) return bwd_sum_s_ / bwd_n_;
  if (!backward_call && fwd_n_) return fwd_sum_s_ / fwd_n_;
  if (backward_call && fwd_n_) return kBackwardPerForward * fwd_sum_s_ / fwd_n_;
  if (!backward_call && bwd_n_) return bwd_sum_s_ / bwd_n_ / kBackwardPerForward;
  if (current_estimate < 0) return -1;
  if (backward_call == backward_call_) return current_estimate;
  return backward_call ? kBackwardPerForward * current_estimate
                       : current_estimate / kBackwardPerForward;
}

std::string ProgressReporter::line_locked(Clock::time_point now) const {
  std::string s = "ringattn: " + phase_;
  if (iteration_ >= 0 && (in_call_ || phase_ == "forward" || phase_ == "backward")) {
    s += ", iteration " + std::to_string(iteration_ + 1) + "/" + std::to_string(iterations_);
    if (iteration_ < warmup_) s += " (warmup)";
    if (steps_ > 1) s += ", ring step " + std::to_string(step_) + "/" + std::to_string(steps_);
  }
  s += ", elapsed " + clock_text(seconds(now - start_));
  if (in_call_) {
    const double in_call = seconds(now - call_start_);
    double current = -1;  // this call's whole time, extrapolated from its steps
    if (steps_ > 0 && step_ > 0) current = in_call * steps_ / step_;
    const double whole = estimate_call_locked(backward_call_, current);
    if (whole >= 0) {
      double left = std::max(0.0, whole - in_call);
      bool known = true;
      // The calls after this one: the rest of this iteration, then whole iterations.
      if (!backward_call_ && backward_) {
        const double b = estimate_call_locked(true, current);
        known = known && b >= 0;
        left += b;
      }
      const int later = iterations_ - iteration_ - 1;
      const double f = estimate_call_locked(false, current);
      const double b = backward_ ? estimate_call_locked(true, current) : 0;
      known = known && f >= 0 && b >= 0;
      left += later * (f + b);
      if (known) s += ", about " + clock_text(left) + " left";
    }
  }
  return s;
}

void ProgressReporter::emit_locked(Clock::time_point now) {
  const std::string line = line_locked(now);
  if (mode_ == ProgressMode::terminal)
    err_ << "\r" << line << "\x1b[K" << std::flush;
  else
    err_ << line << "\n" << std::flush;
  last_line_ = now;
  changed_ = false;
}

void ProgressReporter::tick() {
  const auto period = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
      mode_ == ProgressMode::terminal ? kTerminalRedrawSeconds : 1.0));
  std::unique_lock lock(mu_);
  while (!stopped_) {
    wake_.wait_for(lock, period, [this] { return stopped_; });
    if (stopped_) break;
    const auto now = Clock::now();
    // The terminal line shows the clock, so it is redrawn even without news; a log gets a
    // line when something changed since the last one, or a heartbeat.
    if (mode_ == ProgressMode::terminal || (changed_ && seconds(now - last_line_) >= min_gap_s_) ||
        seconds(now - last_line_) >= kLinesHeartbeatSeconds)
      emit_locked(now);
  }
}

}  // namespace ringattn::cli
