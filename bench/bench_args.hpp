// Command-line handling shared by the CPU benchmarks: Boost.Program_options parsing with
// --help, and comma-separated number lists; a bad option or item is named, exit code 2.
#pragma once

#include <boost/program_options.hpp>
#include <cstddef>
#include <exception>
#include <iostream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace ringattn::bench {

// Parses argv into vm. Returns -1 to go on, 0 after printing the options for --help (which
// `desc` must declare), 2 after naming a bad option on stderr.
inline int parse_options(const char* tool, const boost::program_options::options_description& desc,
                         int argc, char** argv, boost::program_options::variables_map& vm) {
  namespace po = boost::program_options;
  try {
    po::store(po::parse_command_line(argc, argv, desc), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << tool << ": " << e.what() << "\n";
    return 2;
  }
  if (vm.count("help")) {
    std::cout << desc << "\n";
    return 0;
  }
  return -1;
}

// The items of a comma-separated list, each read whole as a T (an integer or a double) and
// accepted by `ok`; otherwise throws std::invalid_argument "'<item>' is not <want>".
template <typename T, typename Ok>
std::vector<T> parse_numbers(const std::string& s, Ok ok, const char* want) {
  std::vector<T> v;
  std::size_t pos = 0;
  while (pos <= s.size()) {
    std::size_t end = s.find(',', pos);
    if (end == std::string::npos) end = s.size();
    const std::string item = s.substr(pos, end - pos);
    std::size_t used = 0;
    T x{};
    try {
      if constexpr (std::is_integral_v<T>)
        x = static_cast<T>(std::stoll(item, &used));
      else
        x = static_cast<T>(std::stod(item, &used));
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || item.empty() || !ok(x))
      throw std::invalid_argument("'" + item + "' is not " + want);
    v.push_back(x);
    pos = end + 1;
  }
  return v;
}

}  // namespace ringattn::bench
