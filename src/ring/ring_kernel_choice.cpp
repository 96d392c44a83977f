// auto's rule for the GPU ring's kernels (see ring_kernel_choice.hpp).
#include "ring/ring_kernel_choice.hpp"

#include <cstdlib>
#include <iomanip>
#include <sstream>
#include <vector>

#include "core/environment.hpp"
#include "ringattn/errors.hpp"
#include "ringattn/field_words.hpp"

namespace ringattn::ring {

bool ring_auto_takes_cudnn(const RingPassTiming& t, bool deterministic) {
  return !deterministic && t.cudnn_ms < t.ours_ms;
}

std::string ring_auto_note(const char* pass, const std::string& ours, const RingPassTiming& t,
                           bool cudnn, bool stubbed) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(3) << field_is("kernel", "auto") << ": ring " << pass << ' '
     << ours << ' ' << t.ours_ms << " ms, cudnn " << t.cudnn_ms << " ms ("
     << (stubbed ? "stubbed by RINGATTN_TEST_RING_AUTO_MS" : "median of 5, slowest rank")
     << "); using " << (cudnn ? "cudnn" : ours);
  return os.str();
}

std::optional<RingPassTiming> ring_auto_stubbed_timing(bool backward) {
  const char* env = environment_value(Env::test_ring_auto_ms);
  if (!env || !*env) return std::nullopt;
  std::vector<double> ms;
  std::istringstream in(env);
  for (std::string part; std::getline(in, part, ',');) {
    char* end = nullptr;
    const double x = std::strtod(part.c_str(), &end);
    if (part.empty() || *end != '\0' || !(x >= 0))
      throw InputError("RINGATTN_TEST_RING_AUTO_MS",
                       "expects 2 or 4 comma-separated milliseconds, got '" + std::string(env) + "'");
    ms.push_back(x);
  }
  if (ms.size() != 2 && ms.size() != 4)
    throw InputError("RINGATTN_TEST_RING_AUTO_MS",
                     "expects 2 or 4 comma-separated milliseconds, got '" + std::string(env) + "'");
  const std::size_t at = backward && ms.size() == 4 ? 2 : 0;
  return RingPassTiming{ms[at], ms[at + 1]};
}

}  // namespace ringattn::ring
