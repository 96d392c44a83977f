// The CLI's words for the library's: the option that sets each JobSpec field, so that an
// error the library raises about a field ("config.segments: ...") reads as one about the
// option the user typed ("--segments: ..."). The one place the CLI translates field names.
#pragma once

#include <exception>
#include <string>

namespace ringattn::cli {

// The option that sets JobSpec field `subject` ("config.shape.seq_len" -> "--seq-len",
// "transport" -> "--comm"); any other subject (an option, a file, an environment variable)
// unchanged.
std::string option_of(const std::string& subject);

// What the CLI prints for `e`: an InputError with its subject in the CLI's words (option_of),
// any other error's what().
std::string cli_message(const std::exception& e);

}  // namespace ringattn::cli
