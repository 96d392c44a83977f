// The ringattn executable: starts MPI when an MPI launcher started it, dispatches
// subcommands, and turns every failure into a message on stderr and an exit code (2 bad
// input, 3 runtime failure); nothing escapes as a crash, and no rank is left waiting.
#include <cstdlib>
#include <iostream>
#include <memory>
#include <new>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "cli/comm_choice.hpp"
#include "cli/option_names.hpp"
#include "cli/options.hpp"
#include "cli/run_command.hpp"
#include "ringattn/errors.hpp"
#include "ringattn/quote.hpp"
#include "ringattn/ringattn.hpp"

namespace {

void print_usage(std::ostream& os) {
  os << "ringattn " << RINGATTN_VERSION
     << ": exact dense and dilated attention over long sequences\n\n"
        "usage: ringattn <command> [options]\n"
        "       mpirun -np P ringattn run [options]     (or srun --mpi=pmix; see launch/)\n\n"
        "commands:\n"
        "  run      compute attention (forward, optionally backward); with no options it\n"
        "           runs an embedded demo and checks it against the float64 reference\n\n"
        "  ringattn run --help     lists the run options\n"
        "  ringattn --version      prints the version\n\n"
        "exit codes: 0 success, 2 bad options or input, 3 runtime failure\n";
}

int fail(ringattn::ExitCode code, const std::string& msg) {
  std::cerr << "ringattn: error: " << ringattn::printable(msg) << "\n";
  return static_cast<int>(code);
}

// A job that was clearly meant to be parallel but sees one rank is a launch mistake
// (ringattn run straight from an sbatch script, or srun without --mpi=pmix).
void check_launch(const ringattn::Comm& comm) {
  const char* ntasks = std::getenv("SLURM_NTASKS");
  if (ntasks && std::atoi(ntasks) > 1 && comm.size() == 1)
    throw ringattn::InputError(
        "launch", std::string("SLURM_NTASKS=") + ntasks +
                      " but MPI reports 1 rank: start ringattn with 'srun --mpi=pmix' (or "
                      "mpirun) inside the allocation, not directly (see launch/)");
}

// Under a launcher the ring is the job's ranks; --ring-size may only confirm it.
void check_ring_size(const ringattn::Comm& comm, const ringattn::cli::RunOptions& opts) {
  if (ringattn::launched_by_mpi() && opts.ring_size != 0 && opts.ring_size != comm.size())
    throw ringattn::InputError(
        "--ring-size", std::to_string(opts.ring_size) + " differs from the " +
                           std::to_string(comm.size()) +
                           " ranks this MPI job was started with (under a launcher the ring is "
                           "the job's ranks; omit --ring-size or start that many)");
}

}  // namespace

int main(int argc, char** argv) {
  using ringattn::ExitCode;
  std::optional<ringattn::Comm> comm;
  try {
    comm =
        ringattn::launched_by_mpi() ? ringattn::mpi_world(&argc, &argv) : ringattn::Comm::single();
  } catch (const std::exception& e) {
    return fail(ExitCode::runtime_failure, ringattn::cli::cli_message(e));
  }
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    if (comm->rank() == 0) print_usage(std::cerr);
    return comm->rank() == 0 ? fail(ExitCode::bad_input, "missing command (try 'ringattn run')")
                             : static_cast<int>(ExitCode::bad_input);
  }
  const std::string cmd = args.front();
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    if (comm->rank() == 0) print_usage(std::cout);
    return 0;
  }
  if (cmd == "--version") {
    if (comm->rank() == 0) std::cout << "ringattn " << RINGATTN_VERSION << "\n";
    return 0;
  }
  if (cmd != "run") {
    return comm->rank() == 0
               ? fail(ExitCode::bad_input, "unknown command '" + cmd + "' (try 'ringattn --help')")
               : static_cast<int>(ExitCode::bad_input);
  }
  args.erase(args.begin());
  ringattn::cli::RunOptions opts;
  bool help = false;
  std::ostringstream help_text;
  ringattn::cli::CommKind kind = ringattn::cli::CommKind::local;
  const int parse_code = ringattn::cli::agree_on_errors(*comm, [&] {
    check_launch(*comm);
    help = !ringattn::cli::parse_run_options(args, opts, help_text);
    if (help) return;
    check_ring_size(*comm, opts);
    ringattn::cli::CommContext c = ringattn::cli::this_build();
    c.requested = opts.comm;
    // --device auto resolves to the GPU only on one rank, so the control communicator is
    // chosen as for the CPU; a GPU job's device transport is chosen by make_engine.
    c.device = opts.device == "cuda" ? "cuda" : "cpu";
    c.launched_by_mpi = ringattn::launched_by_mpi();
    c.world_size = comm->size();
    c.ring_size = opts.ring_size;
    kind = ringattn::cli::choose_comm(c);
  });
  if (parse_code) return parse_code;
  if (help) {
    if (comm->rank() == 0) std::cout << help_text.str();
    return 0;
  }
  // The control communicator is MPI under a launcher, else this process (virtual ranks
  // with --ring-size P); the engine bootstraps NCCL (or device copies) over it for GPU jobs.
  if (kind == ringattn::cli::CommKind::local && opts.ring_size > 1)
    return ringattn::cli::run_command_virtual_ranks(opts, std::cout);
  return ringattn::cli::run_command(opts, *comm, std::cout);
}
