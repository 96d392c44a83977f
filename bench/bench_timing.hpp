// Wall-clock timing shared by the CPU benchmarks: median of `iters` runs after one warm-up;
// a run longer than 3 s is timed once (its warm-up is the measurement).
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

namespace ringattn::bench {

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

template <typename F>
double time_ms(F&& f, int iters) {
  auto t0 = std::chrono::steady_clock::now();
  f();
  const double first = seconds_since(t0);
  if (first > 3.0) return first * 1e3;
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(seconds_since(t0) * 1e3);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace ringattn::bench
