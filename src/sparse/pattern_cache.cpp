// The bounded, thread-safe pattern cache.
#include "sparse/pattern_cache.hpp"

namespace ringattn::sparse {

PatternCache::Lists PatternCache::get(const std::string& key,
                                      const std::function<BlockLists()>& build) {
  std::unique_lock<std::mutex> lock(mu_);
  if (auto it = entries_.find(key); it != entries_.end()) {
    ++hits_;
    lru_.splice(lru_.begin(), lru_, it->second.lru);
    const std::shared_future<Lists> f = it->second.lists;
    lock.unlock();  // the entry may still be building: wait outside the lock
    return f.get();
  }
  ++misses_;
  std::promise<Lists> promise;
  const uint64_t id = ++next_id_;
  lru_.push_front(key);
  entries_.emplace(key, Entry{promise.get_future().share(), lru_.begin(), id});
  while (entries_.size() > capacity_) {
    entries_.erase(lru_.back());
    lru_.pop_back();
  }
  lock.unlock();
  try {
    Lists l = std::make_shared<const BlockLists>(build());
    promise.set_value(l);
    return l;
  } catch (...) {
    promise.set_exception(std::current_exception());
    lock.lock();
    if (auto it = entries_.find(key); it != entries_.end() && it->second.id == id) {
      lru_.erase(it->second.lru);
      entries_.erase(it);
    }
    throw;
  }
}

std::size_t PatternCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}
int64_t PatternCache::hits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hits_;
}
int64_t PatternCache::misses() const {
  std::lock_guard<std::mutex> lock(mu_);
  return misses_;
}
void PatternCache::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  entries_.clear();
  lru_.clear();
}

PatternCache& PatternCache::global() {
  static PatternCache cache(16);
  return cache;
}

std::string cache_key(int64_t seq_len, int64_t block_size, int64_t heads,
                      const std::string& canonical_pattern) {
  return "N=" + std::to_string(seq_len) + ";bs=" + std::to_string(block_size) +
         ";H=" + std::to_string(heads) + ";" + canonical_pattern;
}

}  // namespace ringattn::sparse
