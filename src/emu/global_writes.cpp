// The per-launch shadow of global writes and the store callbacks that instrumented kernel
// sources call (see global_writes.hpp).
#include "emu/global_writes.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "emu/block_runner.hpp"
#include "emu/bulk_reduce.hpp"

namespace ringattn::emu {
namespace {

thread_local LaunchWrites* tl_writes = nullptr;

constexpr std::uint32_t kReduce = 0x80000000u;  // the shadow entry's kind bit

std::string address(std::uintptr_t p) {
  char text[32];
  std::snprintf(text, sizeof text, "0x%llx", static_cast<unsigned long long>(p));
  return text;
}

void free_shadow(std::uint32_t* p) { std::free(p); }

}  // namespace

LaunchWrites::LaunchWrites(std::vector<GlobalRange> ranges, Dim3 grid) : grid_(grid) {
  std::sort(ranges.begin(), ranges.end(),
            [](const GlobalRange& a, const GlobalRange& b) { return a.begin < b.begin; });
  for (const GlobalRange& r : ranges) {
    if (r.end <= r.begin) continue;
    ranges_.push_back(Range{r});
  }
  if (!ranges_.empty()) {
    lo_ = ranges_.front().span.begin;
    for (const Range& r : ranges_) hi_ = std::max(hi_, r.span.end);
  }
  enabled_ = volume(grid) < kReduce;
}

LaunchWrites::Range* LaunchWrites::find(std::uintptr_t p) {
  if (p < lo_ || p >= hi_) return nullptr;
  auto it = std::upper_bound(ranges_.begin(), ranges_.end(), p,
                             [](std::uintptr_t x, const Range& r) { return x < r.span.begin; });
  if (it == ranges_.begin()) return nullptr;
  --it;
  return p < it->span.end ? &*it : nullptr;
}

bool LaunchWrites::is_global(std::uintptr_t p, std::size_t bytes) const {
  if (ranges_.empty()) return true;
  const auto it =
      std::upper_bound(ranges_.begin(), ranges_.end(), p,
                       [](std::uintptr_t x, const Range& r) { return x < r.span.begin; });
  if (it == ranges_.begin()) return false;
  const Range& r = *(it - 1);
  return p < r.span.end && bytes <= r.span.end - p;
}

void LaunchWrites::write(std::uintptr_t p, std::size_t bytes, bool reduce) {
  if (!enabled_ || bytes == 0 || block_ == 0) return;
  Range* r = find(p);
  if (!r) return;
  const std::uintptr_t end = std::min<std::uintptr_t>(p + bytes, r->span.end);
  if (!r->shadow) {
    const std::size_t granules = (r->span.end - r->span.begin + 1) / 2;
    // calloc: large shadows come as untouched zero pages, paid for only where written.
    r->shadow = {static_cast<std::uint32_t*>(std::calloc(granules, sizeof(std::uint32_t))),
                 free_shadow};
    if (!r->shadow) return;  // no memory for the check: the launch runs unchecked there
  }
  std::uint32_t* shadow = r->shadow.get();
  const std::uint32_t mine = block_ | (reduce ? kReduce : 0u);
  for (std::uintptr_t g = (p - r->span.begin) / 2; g <= (end - 1 - r->span.begin) / 2; ++g) {
    const std::uint32_t seen = shadow[g];
    if (seen == 0 || (seen & ~kReduce) == block_) {
      // First write, or the same block again: a plain store there keeps the plain kind.
      shadow[g] = (seen & ~kReduce) == block_ && (seen & kReduce) == 0 ? seen : mine;
      continue;
    }
    if (reduce && (seen & kReduce) != 0) continue;  // reduces of several blocks: their purpose
    if (!deferred_.empty()) return;
    const ThreadState& t = current_thread();
    const std::uintptr_t at = r->span.begin + 2 * g;
    const Dim3 other = unlinear((seen & ~kReduce) - 1, grid_);
    defer(t.warp * kWarpSize + t.lane,
          std::string(reduce ? "a reduce (or atomic add) into"
                             : "a plain store of " + std::to_string(bytes) + " bytes to") +
              " global address " + address(at) + " (byte " + std::to_string(at - r->span.begin) +
              " of the " + std::to_string(r->span.end - r->span.begin) + "-byte allocation at " +
              address(r->span.begin) + "), which block " + to_string(other) +
              " of this launch also " +
              ((seen & kReduce) != 0 ? "reduces (or adds atomically) into"
                                     : "stores to with plain stores") +
              ": a race between blocks, whose result the order of blocks decides (give each "
              "address one block, or use atomics or reduces for every write to it)");
    return;
  }
}

void LaunchWrites::defer(unsigned thread, std::string problem) {
  if (!deferred_.empty()) return;
  deferred_ = std::move(problem);
  deferred_thread_ = thread;
}

LaunchWrites* current_launch_writes() { return tl_writes; }

float atomic_add_f32(float* p, float value) {
  // Blocks run one at a time on the launch's OS thread: the add needs no atomic instruction.
  const float old = *p;
  *p = old + value;
  if (tl_writes) tl_writes->write(reinterpret_cast<std::uintptr_t>(p), sizeof(float), true);
  return old;
}

detail::ScopedLaunchWrites::ScopedLaunchWrites(LaunchWrites* w) : saved_(tl_writes) {
  tl_writes = w;
}
detail::ScopedLaunchWrites::~ScopedLaunchWrites() { tl_writes = saved_; }

}  // namespace ringattn::emu

// The callbacks of -fsanitize=kernel-address in its outline form (GCC and Clang), compiled
// into kernel sources only (CMake: ringattn_emu_instrument_stores). They must not throw.
namespace {

inline void on_store(std::uintptr_t p, std::size_t bytes) noexcept {
  ringattn::emu::LaunchWrites* const w = ringattn::emu::tl_writes;
  if (!w) return;
  try {
    if (w->reduces_in_flight != 0) {
      const std::string problem = ringattn::emu::detail::reduce_conflict(p, bytes, true);
      if (!problem.empty()) {
        const ringattn::emu::ThreadState& t = ringattn::emu::current_thread();
        w->defer(t.warp * ringattn::emu::kWarpSize + t.lane, "a plain " + problem.substr(2));
      }
    }
    w->write(p, bytes, false);
  } catch (...) {
    // Only an allocation failure (std::bad_alloc from a message) can land here: the check
    // then misses this store, and the launch goes on.
  }
}

}  // namespace

extern "C" {
// NOLINTBEGIN(bugprone-reserved-identifier): the names the compiler calls.
void __asan_store1_noabort(std::uintptr_t p) { on_store(p, 1); }
void __asan_store2_noabort(std::uintptr_t p) { on_store(p, 2); }
void __asan_store4_noabort(std::uintptr_t p) { on_store(p, 4); }
void __asan_store8_noabort(std::uintptr_t p) { on_store(p, 8); }
void __asan_store16_noabort(std::uintptr_t p) { on_store(p, 16); }
void __asan_storeN_noabort(std::uintptr_t p, std::size_t n) { on_store(p, n); }
// Emitted before calls that do not return, and around a source's dynamic initialisation
// (GCC): nothing to do.
void __asan_handle_no_return() {}
void __asan_before_dynamic_init(const char*) {}
void __asan_after_dynamic_init() {}
// NOLINTEND(bugprone-reserved-identifier)
}
