// Implementation of agree_on_errors (a template, so it lives beside its header): the
// library's agreement (Comm::agree) and the CLI's way of saying it: the rank the error
// came from prints it once, in the CLI's words (option_names.hpp), every rank returns its
// exit code.
#include <iostream>
#include <string>

#include "cli/option_names.hpp"
#include "ringattn/errors.hpp"
#include "ringattn/quote.hpp"
#include "ringattn/ringattn.hpp"

namespace ringattn::cli {

template <typename F>
int agree_on_errors(Comm& comm, F&& f) {
  int code = 0, rank = -1;
  std::string message;
  try {
    comm.agree(f);
    return 0;
  } catch (const InputError& e) {
    code = static_cast<int>(ExitCode::bad_input), rank = e.rank(), message = cli_message(e);
  } catch (const RuntimeFailure& e) {
    code = static_cast<int>(ExitCode::runtime_failure), rank = e.rank(), message = cli_message(e);
  }
  if (comm.size() == 1 || comm.rank() == rank) {
    std::cerr << "ringattn: ";
    if (comm.size() > 1) std::cerr << "rank " << rank << ": ";
    // Messages quote file contents and option values; printable() is the last guard that
    // nothing in them reaches the terminal as a control sequence.
    std::cerr << "error: " << printable(message) << "\n";
  }
  return code;
}

}  // namespace ringattn::cli
