// A block's dynamic shared memory: one arena per block, poisoned (0xff bytes, NaN in every
// float format) at block start, and reached only through a 32-bit offset (SharedAddress,
// or the typed SharedPtr<T>), so that every access is checked against the arena's bounds
// and the type's alignment, as the device's address space would be.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

namespace ringattn::emu {

// An address in the block's shared memory: what a kernel passes to ldmatrix and cp.async
// (the device's 32-bit shared-window address).
struct SharedAddress {
  std::uint32_t offset = 0;
  friend constexpr SharedAddress operator+(SharedAddress a, std::uint32_t bytes) {
    return SharedAddress{a.offset + bytes};
  }
  friend constexpr bool operator==(SharedAddress, SharedAddress) = default;
};

inline constexpr std::byte kSharedPoison{0xff};

class SharedArena {
 public:
  // Sizes the arena (kept across blocks when big enough) and fills it with the poison.
  void reset(std::uint32_t bytes);
  std::uint32_t size() const { return size_; }
  bool contains(std::uint32_t offset, std::uint32_t bytes) const {
    return offset <= size_ && bytes <= size_ - offset;
  }
  // Unchecked: callers check with contains() and fault naming the right thread.
  std::byte* at(std::uint32_t offset) { return storage_.get() + offset; }

 private:
  struct FreeAligned {
    void operator()(std::byte* p) const;
  };
  std::unique_ptr<std::byte[], FreeAligned> storage_;
  std::uint32_t capacity_ = 0, size_ = 0;
};

// The bytes [at, at + bytes) of the running block's arena for the running thread; faults
// naming the thread when they leave the arena or `at` is not a multiple of `align`. `what`
// names the access in the message ("store", "ldmatrix", ...).
std::byte* checked_shared_bytes(SharedAddress at, std::uint32_t bytes, std::uint32_t align,
                                std::string_view what);
// checked_shared_bytes for a generic-proxy access through SharedPtr, which it also records
// against the running thread (GenericAccess in block_runner.hpp).
std::byte* generic_shared_bytes(SharedAddress at, std::uint32_t bytes, std::uint32_t align);

// fence.proxy.async.shared::cta: orders the running thread's generic accesses to shared
// memory so far before the async proxy's later ones (wgmma, TMA).
void fence_proxy_async_shared();

// A typed pointer into shared memory holding only the 32-bit offset; dereferencing checks.
// Arithmetic wraps like the device's 32-bit addresses, so a pointer moved before the
// arena's start is caught at its first access.
template <typename T>
class SharedPtr {
 public:
  SharedPtr() = default;
  explicit constexpr SharedPtr(SharedAddress at) : offset_(at.offset) {}

  constexpr SharedAddress address() const { return SharedAddress{offset_}; }
  T& operator*() const {
    return *reinterpret_cast<T*>(generic_shared_bytes(address(), sizeof(T), alignof(T)));
  }
  T& operator[](std::ptrdiff_t i) const { return *(*this + i); }
  constexpr SharedPtr operator+(std::ptrdiff_t i) const {
    const auto moved = static_cast<std::int64_t>(offset_) +
                       static_cast<std::int64_t>(i) * static_cast<std::int64_t>(sizeof(T));
    return SharedPtr(SharedAddress{static_cast<std::uint32_t>(moved)});
  }
  constexpr SharedPtr operator-(std::ptrdiff_t i) const { return *this + (-i); }
  SharedPtr& operator+=(std::ptrdiff_t i) { return *this = *this + i; }
  template <typename U>
  constexpr SharedPtr<U> as() const {
    return SharedPtr<U>(address());
  }
  friend constexpr bool operator==(SharedPtr, SharedPtr) = default;

 private:
  std::uint32_t offset_ = 0;
};

// The start of the running block's dynamic shared memory (`extern __shared__ T smem[]`).
template <typename T>
constexpr SharedPtr<T> dynamic_shared_memory() {
  return SharedPtr<T>(SharedAddress{0});
}

}  // namespace ringattn::emu
