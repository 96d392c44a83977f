#include "cli_runner.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace ringattn::testing {

namespace {
std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
}  // namespace

CliResult run_cli(const std::vector<std::string>& args, const std::vector<std::string>& env_add) {
  // RINGATTN_CLI_PATH in the environment overrides the compiled-in path (carried builds).
  const char* env = std::getenv("RINGATTN_CLI_PATH");
  std::vector<std::string> a = args;
  // `--device auto` (the default) picks a GPU where one is usable; the CLI tests that name
  // no device test the CPU path, on any machine. (The bare `run`, the demo, stays as is.)
  const bool names_device = std::find_if(a.begin(), a.end(), [](const std::string& x) {
                              return x == "--device" || x.rfind("--device=", 0) == 0 ||
                                     x == "--help" || x == "-h" || x == "--config";
                            }) != a.end();
  if (a.size() > 1 && a.front() == "run" && !names_device) a.insert(a.end(), {"--device", "cpu"});
  return run_program(env && *env ? env : RINGATTN_CLI_PATH, a, env_add);
}

CliResult run_program(const std::string& program, const std::vector<std::string>& args,
                      const std::vector<std::string>& env) {
  TempDir tmp;
  const std::string out_path = tmp.file("stdout"), err_path = tmp.file("stderr");
  // Buffered output of the test itself would otherwise be flushed by the child too.
  std::fflush(nullptr);
  pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    if (!freopen(out_path.c_str(), "w", stdout) || !freopen(err_path.c_str(), "w", stderr))
      _exit(127);
    for (const auto& e : env) putenv(const_cast<char*>(e.c_str()));
    std::vector<char*> argv;
    std::string prog = program;
    argv.push_back(prog.data());
    std::vector<std::string> copy = args;
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    execvp(prog.c_str(), argv.data());
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  CliResult r;
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  r.out = slurp(out_path);
  r.err = slurp(err_path);
  return r;
}

TempDir::TempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "ringattn-test-XXXXXX").string();
  if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

}  // namespace ringattn::testing
