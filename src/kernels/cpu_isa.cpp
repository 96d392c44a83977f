// The CPU kernels' vector variant (see cpu_isa.hpp).
#include "kernels/cpu_isa.hpp"

#include <atomic>
#include <string_view>

#include "core/environment.hpp"
#include "ringattn/errors.hpp"

namespace ringattn::kernels {

namespace {

constexpr const char* kVariable = environment_name(Env::cpu_kernels);

const char* pretty(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::avx512:
      return "AVX-512";
    case CpuIsa::avx2:
      return "AVX2";
    case CpuIsa::portable:
      break;
  }
  return "portable C++";
}

CpuIsa checked(CpuIsa isa) {
  if (!cpu_can_run(isa))
    throw InputError(kVariable, std::string("'") + to_string(isa) +
                                    "' asked for, but this CPU cannot execute it (it runs " +
                                    to_string(best_cpu_isa()) + " at most)");
  return isa;
}

struct Choice {
  CpuIsa isa;
  bool forced;
};

Choice from_environment() {
  const char* env = environment_value(Env::cpu_kernels);
  if (!env || !*env || std::string_view(env) == "auto") return {best_cpu_isa(), false};
  const std::string_view v(env);
  for (CpuIsa isa : {CpuIsa::avx512, CpuIsa::avx2, CpuIsa::portable})
    if (v == to_string(isa)) return {checked(isa), true};
  throw InputError(kVariable,
                   "'" + std::string(v) + "' is not a variant; use auto, avx512, avx2 or portable");
}

struct Slot {
  std::atomic<int> isa;
  std::atomic<bool> forced;
  explicit Slot(Choice c) : isa(static_cast<int>(c.isa)), forced(c.forced) {}
};

Slot& slot() {
  static Slot s(from_environment());
  return s;
}

}  // namespace

const char* to_string(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::avx512:
      return "avx512";
    case CpuIsa::avx2:
      return "avx2";
    case CpuIsa::portable:
      break;
  }
  return "portable";
}

bool cpu_can_run(CpuIsa isa) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  switch (isa) {
    case CpuIsa::avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma");
    case CpuIsa::avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case CpuIsa::portable:
      return true;
  }
  return false;
#else
  return isa == CpuIsa::portable;
#endif
}

CpuIsa best_cpu_isa() {
  for (CpuIsa isa : {CpuIsa::avx512, CpuIsa::avx2})
    if (cpu_can_run(isa)) return isa;
  return CpuIsa::portable;
}

CpuIsa cpu_isa() { return static_cast<CpuIsa>(slot().isa.load(std::memory_order_relaxed)); }

bool cpu_isa_forced() { return slot().forced.load(std::memory_order_relaxed); }

void set_cpu_isa(CpuIsa isa) {
  slot().isa.store(static_cast<int>(checked(isa)), std::memory_order_relaxed);
}

std::string cpu_isa_summary() {
  const CpuIsa isa = cpu_isa(), best = best_cpu_isa();
  std::string s = pretty(isa);
  if (!cpu_isa_forced()) return s + " (chosen by ringattn, from the CPU's features)";
  s += std::string(" (") + kVariable;
  if (isa != best) s += std::string("; the CPU has ") + pretty(best);
  return s + ")";
}

}  // namespace ringattn::kernels
