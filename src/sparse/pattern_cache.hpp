// The pattern cache: block lists keyed by (N, block size, heads, canonical pattern), built
// once and shared by every plan that asks for the same key. Thread-safe: concurrent
// requests for one key build it once (the others wait for that build). Bounded: the least
// recently used entries are dropped past `capacity` (plans keep their own shared_ptr, so
// dropping never invalidates lists in use). Lists live in host memory, where the CPU
// kernels run; a CUDA plan uploads them once into its own device workspace.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <future>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "sparse/block_lists.hpp"

namespace ringattn::sparse {

class PatternCache {
 public:
  explicit PatternCache(std::size_t capacity) : capacity_(capacity) {}

  using Lists = std::shared_ptr<const BlockLists>;
  // Returns the cached lists for `key`, or builds them with `build` (outside the lock).
  // A build that throws is not cached; the exception reaches every waiter.
  Lists get(const std::string& key, const std::function<BlockLists()>& build);

  std::size_t size() const;
  int64_t hits() const;
  int64_t misses() const;
  void clear();

  // The process-wide cache plans use (capacity 16).
  static PatternCache& global();

 private:
  struct Entry {
    std::shared_future<Lists> lists;
    std::list<std::string>::iterator lru;
    uint64_t id = 0;  // which build made the entry
  };
  mutable std::mutex mu_;
  std::size_t capacity_;
  std::list<std::string> lru_;  // front: most recently used
  std::unordered_map<std::string, Entry> entries_;
  int64_t hits_ = 0, misses_ = 0;
  uint64_t next_id_ = 0;
};

std::string cache_key(int64_t seq_len, int64_t block_size, int64_t heads,
                      const std::string& canonical_pattern);

}  // namespace ringattn::sparse
