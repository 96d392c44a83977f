// Implementation of agree_on_errors (a template, so it lives beside its header).
#include <iostream>
#include <new>
#include <string>

#include "ringattn/errors.hpp"
#include "ringattn/quote.hpp"

namespace ringattn::cli {

template <typename F>
int agree_on_errors(ring::Communicator& comm, F&& f) {
  int code = 0;
  std::string message;
  try {
    f();
  } catch (const InputError& e) {
    code = static_cast<int>(ExitCode::bad_input);
    message = e.what();
  } catch (const RuntimeFailure& e) {
    code = static_cast<int>(ExitCode::runtime_failure);
    message = e.what();
  } catch (const std::bad_alloc&) {
    code = static_cast<int>(ExitCode::runtime_failure);
    message = "out of memory; use more ranks or a smaller --seq-len/--batch/--heads";
  } catch (const std::exception& e) {
    code = static_cast<int>(ExitCode::runtime_failure);
    message = e.what();
  }
  const int64_t worst = comm.max(static_cast<int64_t>(code));
  if (worst == 0) return 0;
  // The lowest failing rank speaks (ranks usually fail alike, e.g. on a bad option).
  const int64_t first_bad = -comm.max(code ? -static_cast<int64_t>(comm.rank()) : INT64_MIN);
  if (code && comm.rank() == first_bad) {
    std::cerr << "ringattn: ";
    if (comm.size() > 1) std::cerr << "rank " << comm.rank() << ": ";
    // Messages quote file contents and option values; printable() is the last guard that
    // nothing in them reaches the terminal as a control sequence.
    std::cerr << "error: " << printable(message) << "\n";
  }
  return static_cast<int>(worst);
}

}  // namespace ringattn::cli
