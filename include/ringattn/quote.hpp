// Printing text that came from outside the program (a .npy header field, a --config line, an
// option value that may have come from a file) in an error message: escapes for every byte a
// terminal could act on, and a cap on how much of it is shown. ringattn's own messages quote
// what they were given this way; a front end passes a whole message through printable()
// before it reaches a terminal.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace ringattn {

// How many bytes of a quoted field an error message shows.
inline constexpr std::size_t kQuoteMaxBytes = 60;

// `text` with every byte outside printable ASCII written as an escape (\n, \r, \t, else \xNN)
// and the backslash as \\; at most `max_bytes` bytes of `text` are shown, followed by "..."
// when it was cut. For a subject, or a token inside a message that is itself quoted.
std::string escaped(std::string_view text, std::size_t max_bytes = kQuoteMaxBytes);

// The same, in quotes as Python's repr() writes them ('<f8', or "it's" when that saves
// escaping; the quote in use is escaped), the "..." after the closing quote: '\x1b[2J'.
std::string quote(std::string_view text, std::size_t max_bytes = kQuoteMaxBytes);

// A whole message about to be written to a terminal (one line): control bytes, DEL and the
// UTF-8 C1 controls (U+0080..U+009F) become \xNN; everything else, quotes, backslashes and
// other UTF-8 included, is kept, so fields already escaped are not escaped twice. Cut to
// `max_bytes` bytes (with "...") if given.
std::string printable(std::string_view message, std::size_t max_bytes = std::string_view::npos);

}  // namespace ringattn
