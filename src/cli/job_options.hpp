// The run options as the library's JobSpec: the shape, documents and block mask read from
// the input files where they were given (each problem named by its option and file), the
// option words turned into typed fields. And the reverse direction for errors: a library
// error about a shape field the user never gave is re-aimed at the file it came from.
#pragma once

#include "cli/options.hpp"
#include "ringattn/ringattn.hpp"

namespace ringattn::cli {

JobSpec job_spec(const RunOptions& opts);

// Runs `f`; an InputError it raises is said in the CLI's words (option_names.hpp) and, when
// the input came from files, aimed at the file: a shape option the user did not give (the
// layout's "--seq-len: N tokens cannot be split ...", validate()'s "--heads") becomes --q's
// file, where that dimension came from, and problems with the documents or the block mask
// name their --cu-seqlens or --block-mask file.
void blaming_input_files(const RunOptions& opts, const std::function<void()>& f);

}  // namespace ringattn::cli
