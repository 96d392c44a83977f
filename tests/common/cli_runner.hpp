// Runs the ringattn executable as a child process and captures its exit code and output.
#pragma once

#include <string>
#include <vector>

namespace ringattn::testing {

struct CliResult {
  int exit_code = -1;  // -1 when the child died from a signal
  int signal = 0;      // the signal number in that case
  std::string out, err;
};

// args exclude the program name; e.g. {"run", "--seq-len", "64"}. A `run` that names no
// --device (and no --config, which may) gets `--device cpu`, so CPU tests stay CPU tests on
// a machine with a GPU. `env` entries ("NAME=value") are added to the child's environment.
CliResult run_cli(const std::vector<std::string>& args, const std::vector<std::string>& env = {});

// Runs any program (e.g. mpiexec) with `args`; `env` entries ("NAME=value") are added to the
// child's environment.
CliResult run_program(const std::string& program, const std::vector<std::string>& args,
                      const std::vector<std::string>& env = {});

// A fresh empty directory under the system temp dir, removed by the destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace ringattn::testing
