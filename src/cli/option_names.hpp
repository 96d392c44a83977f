// The CLI's words for the library's: the option that sets each JobSpec field, so that an
// error the library raises about a field ("config.segments: ...") reads as one about the
// option the user typed ("--segments: ..."), and a message or note that names a field
// ("kernel=auto: ...") names the option ("--kernel auto: ..."). The one place the CLI
// translates field names.
#pragma once

#include <exception>
#include <string>
#include <string_view>

namespace ringattn::cli {

// The option that sets JobSpec field `subject` ("config.shape.seq_len" -> "--seq-len",
// "transport" -> "--comm"); any other subject (an option, a file, an environment variable)
// unchanged.
std::string option_of(const std::string& subject);

// A library text (a message, a note) with its field words (ringattn/field_words.hpp) in the
// CLI's: "kernel=auto" -> "--kernel auto", "config.causal=true" -> "--causal", "sinks=false"
// -> "no --sinks", "attention_auto=true" -> "--attention auto", "config.shape.heads" ->
// "--heads". Every library text the CLI prints or writes goes through it.
std::string option_words(std::string_view text);

// What the CLI prints for `e`: an InputError with its subject in the CLI's words (option_of),
// any other error's what(), either with its text in the CLI's words (option_words).
std::string cli_message(const std::exception& e);

}  // namespace ringattn::cli
