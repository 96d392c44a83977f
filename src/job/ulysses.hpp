// Ulysses x ring (two-dimensional context parallelism, docs/COMMUNICATION.md): P = U x R
// ranks form R groups of U consecutive ranks. Each rank holds 1/U of its group's ring shard
// (the rows rank g of an R-rank ring would hold), for all heads. An all-to-all inside the
// group turns that into the group's whole ring shard for H/U heads (and the K/V heads those
// read); the ring of the layers below then runs over the R ranks holding the same heads;
// an all-to-all turns the outputs (in the backward dQ, dK, dV) back.
//
// Heads: member m of a group computes query heads [m·H/U, (m+1)·H/U). K/V heads are split
// the same way when U divides HKV; when instead H/U divides the queries per K/V head, each
// member reads one K/V head, which goes to exactly the members whose query heads read it,
// and their dK/dV partials are summed on the way back. Other GQA splits are refused.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/head_slice.hpp"
#include "job/engine_impl.hpp"

namespace ringattn::job {

// Whether heads split over U ranks (see above); "" when they do, else why not.
std::string ulysses_head_split_problem(int64_t heads, int64_t kv_heads, int u);

// This rank's slice of the job: its query heads, its K/V heads, the block lists of its heads.
struct UlyssesSlice {
  int u = 1, member = 0;
  AttentionConfig cfg;  // shape.heads = H / U
  HeadSlice heads;      // which of the job's H heads cfg computes
  std::shared_ptr<const sparse::BlockLists> lists;
  int64_t job_kv_heads = 0;
  bool kv_shared = false;  // several members read one K/V head (their dK/dV are summed)
  // The job's first K/V head member m reads (cfg's K/V heads from there).
  int64_t kv_first_of(int m) const;
};
UlyssesSlice ulysses_slice(const AttentionConfig& cfg,
                           const std::shared_ptr<const sparse::BlockLists>& lists, int u,
                           int member);

// Bytes this rank's forward all-to-alls send: q, k, v in the device dtype (elem bytes),
// out and lse back in fp32. What the engine sends is exactly this.
int64_t ulysses_forward_a2a_bytes(const AttentionConfig& cfg, int u, int64_t local_rows,
                                  int elem_bytes);

// How the all-to-alls move memory: host memcpy, or copies on a device stream.
class Moves {
 public:
  virtual ~Moves() = default;
  // Owned by this object until it is destroyed.
  virtual void* allocate(std::size_t bytes, const char* what) = 0;
  // `height` rows of `width` bytes, dst and src rows `dpitch` and `spitch` bytes apart.
  virtual void copy2d(void* dst, std::size_t dpitch, const void* src, std::size_t spitch,
                      std::size_t width, std::size_t height) = 0;
  // The same for fp32 data, added into dst.
  virtual void add2d(float* dst, std::size_t dpitch, const float* src, std::size_t spitch,
                     std::size_t width, std::size_t height) = 0;
  virtual void zero(void* dst, std::size_t bytes) = 0;
  // Before an exchange reads the packed blocks: orders it after the copies (device).
  virtual void before_exchange(ring::Communicator& comm) { (void)comm; }
  // After an exchange completed: orders later copies after it (device).
  virtual void after_exchange(ring::PendingExchange& done) { (void)done; }
};

std::unique_ptr<Moves> make_host_moves();
// Copies on `stream` (cudaStream_t) of `device`; defined with the CUDA plans.
std::unique_ptr<Moves> make_device_moves(void* stream, int device);

// The backend of a Ulysses job: the all-to-alls around `inner`, a backend of the layers
// below built on `ring` for the slice. Owns both communicators; `comm` is the whole job's.
std::unique_ptr<Backend> make_ulysses_backend(const UlyssesSlice& slice, int64_t local_rows,
                                              ring::Communicator& comm,
                                              std::unique_ptr<ring::Communicator> group,
                                              std::unique_ptr<ring::Communicator> ring_comm,
                                              std::unique_ptr<Backend> inner,
                                              std::unique_ptr<Moves> moves, double timeout_s);

}  // namespace ringattn::job
