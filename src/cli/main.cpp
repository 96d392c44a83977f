// The ringattn executable: dispatches subcommands and turns every failure into a message
// on stderr and an exit code (2 bad input, 3 runtime failure); nothing escapes as a crash.
#include <iostream>
#include <new>
#include <string>
#include <vector>

#include "cli/options.hpp"
#include "cli/run_command.hpp"
#include "ringattn/errors.hpp"

namespace {

void print_usage(std::ostream& os) {
  os << "ringattn " << RINGATTN_VERSION
     << ": exact dense and dilated attention over long sequences\n\n"
        "usage: ringattn <command> [options]\n\n"
        "commands:\n"
        "  run      compute attention (forward, optionally backward); with no options it\n"
        "           runs an embedded demo and checks it against the float64 reference\n\n"
        "  ringattn run --help     lists the run options\n"
        "  ringattn --version      prints the version\n\n"
        "exit codes: 0 success, 2 bad options or input, 3 runtime failure\n";
}

int fail(ringattn::ExitCode code, const std::string& msg) {
  std::cerr << "ringattn: error: " << msg << "\n";
  return static_cast<int>(code);
}

}  // namespace

int main(int argc, char** argv) {
  using ringattn::ExitCode;
  try {
    std::vector<std::string> args(argv + 1, argv + argc);
    if (args.empty()) {
      print_usage(std::cerr);
      return fail(ExitCode::bad_input, "missing command (try 'ringattn run')");
    }
    const std::string cmd = args.front();
    if (cmd == "--help" || cmd == "-h" || cmd == "help") {
      print_usage(std::cout);
      return 0;
    }
    if (cmd == "--version") {
      std::cout << "ringattn " << RINGATTN_VERSION << "\n";
      return 0;
    }
    if (cmd != "run")
      return fail(ExitCode::bad_input, "unknown command '" + cmd + "' (try 'ringattn --help')");
    args.erase(args.begin());
    ringattn::cli::RunOptions opts;
    if (!ringattn::cli::parse_run_options(args, opts, std::cout)) return 0;
    return ringattn::cli::run_command(opts, std::cout);
  } catch (const ringattn::InputError& e) {
    return fail(ExitCode::bad_input, e.what());
  } catch (const ringattn::RuntimeFailure& e) {
    return fail(ExitCode::runtime_failure, e.what());
  } catch (const std::bad_alloc&) {
    return fail(ExitCode::runtime_failure,
                "out of memory; use a smaller --seq-len/--batch/--heads (more ranks arrive with "
                "the distributed ring)");
  } catch (const std::exception& e) {
    return fail(ExitCode::runtime_failure, e.what());
  } catch (...) {
    return fail(ExitCode::runtime_failure, "unknown internal error");
  }
}
