// Typed errors that carry the process exit code the CLI must use.
// InputError (exit 2) always names what is at fault; RuntimeFailure (exit 3) covers
// everything that goes wrong after the input was accepted.
#pragma once

#include <stdexcept>
#include <string>

namespace ringattn {

enum class ExitCode : int { ok = 0, bad_input = 2, runtime_failure = 3 };

// Bad options, bad files, bad shapes: the user can fix it. `subject` is what the message is
// about. The library names a JobSpec field by its member path from the JobSpec, as C++ code
// writes it: "config.shape.seq_len", "config.segments", "config.window_left",
// "block_sparse.pattern", "block_sparse.mask", "device", "transport", "timeout_s",
// "ulysses". Otherwise: a call's argument ("q", "dsinks", "ranks") or an environment
// variable ("RINGATTN_BLAS_LIBRARY"). Front ends say it in their own words (the CLI
// "--segments", Python "segments") and may add subjects of their own (a file: "--q (q.npy)").
class InputError : public std::runtime_error {
 public:
  InputError(std::string subject, std::string problem)
      : std::runtime_error(subject + ": " + problem),
        subject_(std::move(subject)),
        problem_(std::move(problem)) {}
  const std::string& subject() const noexcept { return subject_; }
  // The message without the subject, so that a caller who knows better can re-aim it.
  const std::string& problem() const noexcept { return problem_; }
  // The rank whose error this is, when every rank of a job raised it together (make_engine
  // agrees on setup errors); -1 when only this rank knows of it.
  int rank() const noexcept { return rank_; }
  InputError& from_rank(int rank) noexcept {
    rank_ = rank;
    return *this;
  }

 private:
  std::string subject_;
  std::string problem_;
  int rank_ = -1;
};

// Failures after validation: allocation, I/O while writing results, library errors.
class RuntimeFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
  // As InputError::rank().
  int rank() const noexcept { return rank_; }
  RuntimeFailure& from_rank(int rank) noexcept {
    rank_ = rank;
    return *this;
  }

 private:
  int rank_ = -1;
};

// A GPU kernel that did not finish within the watchdog's timeout (JobSpec::timeout_s): the
// device is left running it, so nothing more can be done on it in this process. The message
// names the kernel; end the process (the CLI exits at once, with exit code 3).
class DeviceHang : public RuntimeFailure {
 public:
  using RuntimeFailure::RuntimeFailure;
};

}  // namespace ringattn
