// How ringattn's messages and notes name a JobSpec field: by its member path from the JobSpec
// ("config.shape.heads", "timeout_s"), and a field holding a value as `field=value`
// ("kernel=auto", "config.causal=true"). These are the library's words; a front end with words
// of its own (the CLI's options, Python's keywords) finds them with reword_fields and says them
// its way where it prints a message (docs/API.md, "Errors and notes").
#pragma once

#include <concepts>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace ringattn {

// "field=value": the words for JobSpec field `field` (its member path) holding `value` (as the
// field's to_string writes it: "auto", "block-sparse"; a number; a quote()d text).
std::string field_is(std::string_view field, std::string_view value);
// "field=true" / "field=false". (A template, so that a string literal or a number never
// converts to bool and picks it.)
template <std::same_as<bool> B>
std::string field_is(std::string_view field, B value) {
  return field_is(field, value ? std::string_view("true") : std::string_view("false"));
}

// `text` with each of the library's field words replaced by what `say(field, value)` returns
// for it, or left as it is where `say` returns nothing. `field` is a JobSpec member path;
// `value` the text after '=' (a quoted value with its quotes), or none for a bare mention.
// Found: a field's path at the start of a word (not after a letter, digit, '_', '.' or '-'),
// ending there (not followed by a letter, digit or '_', nor by '.' and one), followed by '='
// and a value, or bare. A bare path that is also a word of prose (device, dtype, kernel,
// transport, threads, sinks, deterministic) is not a mention: the library writes those with a
// value. Quoted text ('...' or "..." opened at the start of a word) is left alone: it is what
// someone gave, not the library's words.
std::string reword_fields(std::string_view text,
                          const std::function<std::optional<std::string>(
                              std::string_view field, std::optional<std::string_view> value)>& say);

}  // namespace ringattn
