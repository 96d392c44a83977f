// The Ulysses backend (see ulysses.hpp): every all-to-all is a list of moves, one per
// tensor. A move packs this rank's block for each group member (heads for a scatter, rows
// for a gather) into its send slots, posts the exchange at once (so the next tensor packs
// while this one travels) and, once every move of the direction is posted, unpacks each as
// it completes. Blocks are whole [B, rows, heads, width] boxes in the tensor's own major
// order, so packing and unpacking are 2-D copies (host memcpy or cudaMemcpy2DAsync).
#include "job/ulysses.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ringattn/errors.hpp"

namespace ringattn::job {

namespace {

using Clock = std::chrono::steady_clock;

// Tags of the all-to-alls: above every ring step's tag (4 per step) for P < 4096, below
// MPI's guaranteed MPI_TAG_UB (32767).
constexpr int kTagBase = 1 << 14;

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// A tensor as the all-to-alls see it: B x rows x heads x width elements of `elem` bytes,
// token-major ([B, rows, heads, width]) or head-major ([B, heads, rows, width]; lse too,
// with width 1).
struct Geom {
  int64_t batch = 0, rows = 0, heads = 0, width = 0;
  bool head_major = false;
  std::size_t elem = 4;
};

// The box rows [r0, r0 + n) x heads [h0, h0 + c) of a tensor, against a packed block
// [B, n, c, width] (or [B, c, n, width]) in the same major order: one 2-D copy per batch.
struct Box {
  int64_t r0 = 0, n = 0, h0 = 0, c = 0;
};

std::size_t block_bytes(const Geom& g, const Box& b) {
  return static_cast<std::size_t>(g.batch * b.n * b.c * g.width) * g.elem;
}

template <class F>
void for_each_batch(const Geom& g, const Box& x, F&& f) {
  const auto e = static_cast<int64_t>(g.elem);
  for (int64_t b = 0; b < g.batch; ++b) {
    const int64_t block_off = b * x.n * x.c * g.width * e;
    if (!g.head_major)
      f(static_cast<std::size_t>(((b * g.rows + x.r0) * g.heads + x.h0) * g.width * e),
        static_cast<std::size_t>(g.heads * g.width * e), static_cast<std::size_t>(block_off),
        static_cast<std::size_t>(x.c * g.width * e), static_cast<std::size_t>(x.c * g.width * e),
        static_cast<std::size_t>(x.n));
    else
      f(static_cast<std::size_t>(((b * g.heads + x.h0) * g.rows + x.r0) * g.width * e),
        static_cast<std::size_t>(g.rows * g.width * e), static_cast<std::size_t>(block_off),
        static_cast<std::size_t>(x.n * g.width * e), static_cast<std::size_t>(x.n * g.width * e),
        static_cast<std::size_t>(x.c));
  }
}

void pack(Moves& mv, const Geom& g, const void* tensor, const Box& x, void* block) {
  for_each_batch(g, x,
                 [&](std::size_t t_off, std::size_t t_pitch, std::size_t b_off, std::size_t b_pitch,
                     std::size_t width, std::size_t height) {
                   mv.copy2d(static_cast<char*>(block) + b_off, b_pitch,
                             static_cast<const char*>(tensor) + t_off, t_pitch, width, height);
                 });
}

void unpack(Moves& mv, const Geom& g, void* tensor, const Box& x, const void* block, bool add) {
  for_each_batch(g, x,
                 [&](std::size_t t_off, std::size_t t_pitch, std::size_t b_off, std::size_t b_pitch,
                     std::size_t width, std::size_t height) {
                   if (add)
                     mv.add2d(
                         reinterpret_cast<float*>(static_cast<char*>(tensor) + t_off), t_pitch,
                         reinterpret_cast<const float*>(static_cast<const char*>(block) + b_off),
                         b_pitch, width, height);
                   else
                     mv.copy2d(static_cast<char*>(tensor) + t_off, t_pitch,
                               static_cast<const char*>(block) + b_off, b_pitch, width, height);
                 });
}

class HostMoves final : public Moves {
 public:
  void* allocate(std::size_t bytes, const char*) override {
    return blocks_.emplace_back(bytes ? bytes : 1).data();
  }
  void copy2d(void* dst, std::size_t dpitch, const void* src, std::size_t spitch, std::size_t width,
              std::size_t height) override {
    for (std::size_t i = 0; i < height; ++i)
      std::memcpy(static_cast<char*>(dst) + i * dpitch, static_cast<const char*>(src) + i * spitch,
                  width);
  }
  void add2d(float* dst, std::size_t dpitch, const float* src, std::size_t spitch,
             std::size_t width, std::size_t height) override {
    const std::size_t n = width / sizeof(float);
    for (std::size_t i = 0; i < height; ++i) {
      float* d = reinterpret_cast<float*>(reinterpret_cast<char*>(dst) + i * dpitch);
      const float* s =
          reinterpret_cast<const float*>(reinterpret_cast<const char*>(src) + i * spitch);
      for (std::size_t j = 0; j < n; ++j) d[j] += s[j];
    }
  }
  void zero(void* dst, std::size_t bytes) override { std::memset(dst, 0, bytes); }

 private:
  std::vector<std::vector<std::byte>> blocks_;
};

class UlyssesBackend final : public Backend {
 public:
  UlyssesBackend(const UlyssesSlice& slice, int64_t local_rows, ring::Communicator& comm,
                 std::unique_ptr<ring::Communicator> group,
                 std::unique_ptr<ring::Communicator> ring_comm, std::unique_ptr<Backend> inner,
                 std::unique_ptr<Moves> moves, double timeout_s)
      : s_(slice),
        lu_(local_rows),
        comm_(comm),
        group_(std::move(group)),
        ring_(std::move(ring_comm)),
        inner_(std::move(inner)),
        moves_(std::move(moves)),
        timeout_s_(timeout_s) {
    eb_ = bytes_per_element(inner_->dtype());
    allocate();
  }

  ~UlyssesBackend() override {
    // The moves run on the inner backend's stream (a GPU's): they finish and go while that
    // stream exists (synchronising a destroyed stream crashed on a real GPU; the emulator's
    // streams outlive their handles). Then the inner backend, whose communication thread
    // uses ring_, before ring_.
    moves_.reset();
    inner_.reset();
  }

  void forward(const void* q, const void* k, const void* v, float* out, float* lse) override {
    fwd_ = {};
    run({scatter("q", q, q_in_, qgeom(eb_), false), scatter("k", k, k_in_, kvgeom(eb_), true),
         scatter("v", v, v_in_, vgeom(eb_), true)},
        fwd_);
    inner_->forward(q_in_, k_in_, v_in_, static_cast<float*>(out_in_),
                    static_cast<float*>(lse_in_));
    run({gather("out", out_in_, out, ogeom(4), false, false),
         gather("lse", lse_in_, lse, lsegeom(), false, false)},
        fwd_);
  }

  void backward(const void* q, const void* k, const void* v, const float* out, const float* lse,
                const void* dout, float* dq, float* dk, float* dv) override {
    bwd_ = {};
    run({scatter("q", q, q_in_, qgeom(eb_), false), scatter("k", k, k_in_, kvgeom(eb_), true),
         scatter("v", v, v_in_, vgeom(eb_), true),
         scatter("dout", dout, dout_in_, ogeom(eb_), false),
         scatter("out", out, out_in_, ogeom(4), false),
         scatter("lse", lse, lse_in_, lsegeom(), false)},
        bwd_);
    inner_->backward(q_in_, k_in_, v_in_, static_cast<const float*>(out_in_),
                     static_cast<const float*>(lse_in_), dout_in_, static_cast<float*>(dq_in_),
                     static_cast<float*>(dk_in_), static_cast<float*>(dv_in_));
    run({gather("dq", dq_in_, dq, qgeom(4), false, false),
         gather("dk", dk_in_, dk, kvgeom(4), true, s_.kv_shared),
         gather("dv", dv_in_, dv, vgeom(4), true, s_.kv_shared)},
        bwd_);
  }

  void synchronize() override { inner_->synchronize(); }
  void* stream() const override { return inner_->stream(); }
  DeviceDType dtype() const override { return inner_->dtype(); }

  void fill(EngineStats& st) const override {
    inner_->fill(st);
    st.engine = "Ulysses(" + std::to_string(s_.u) + ") x " + st.engine;
    st.ulysses = s_.u;
    st.workspace_bytes += staging_bytes_;
    if (st.device == "cuda" || inner_->stream()) st.device_workspace_bytes += staging_bytes_;
    add_pass(st.forward, fwd_);
    add_pass(st.backward, bwd_);
    st.bytes_sent_a2a = fwd_.bytes;
    st.bytes_sent = st.forward.bytes_sent;
    st.comm_exposed_ms = st.forward.comm_exposed_ms;
  }

 private:
  // One pass's all-to-all figures, and the inner backend's wall time.
  struct A2aTimes {
    double comm_ms = 0, exposed_ms = 0, compute_ms = 0;
    int64_t bytes = 0;
  };
  struct Move {
    const char* name = "";
    const void* src = nullptr;
    void* dst = nullptr;
    Geom outer, inner;
    bool kv = false, scatter = true, add = false;
  };

  Geom qgeom(std::size_t elem) const {
    const Shape4& sh = s_.cfg.shape;
    return {sh.batch, 0, sh.heads, sh.head_dim, s_.cfg.layout == TensorLayout::bhnd, elem};
  }
  Geom kvgeom(std::size_t elem) const {
    const Shape4& sh = s_.cfg.shape;
    return {sh.batch,
            0,
            s_.cfg.effective_kv_heads(),
            sh.head_dim,
            s_.cfg.effective_kv_layout() == TensorLayout::bhnd,
            elem};
  }
  // v, dv (K/V heads) and out, dout (query heads): rows of the values' head dim.
  Geom vgeom(std::size_t elem) const {
    Geom g = kvgeom(elem);
    g.width = s_.cfg.effective_head_dim_v();
    return g;
  }
  Geom ogeom(std::size_t elem) const {
    Geom g = qgeom(elem);
    g.width = s_.cfg.effective_head_dim_v();
    return g;
  }
  Geom lsegeom() const { return {s_.cfg.shape.batch, 0, s_.cfg.shape.heads, 1, true, 4}; }

  // The inner geometry is the slice's (group rows, its heads); the outer one this rank's
  // rows and the job's heads.
  Move make_move(const char* name, const void* src, void* dst, Geom g, bool kv, bool is_scatter,
                 bool add) const {
    Move m;
    m.name = name, m.src = src, m.dst = dst, m.kv = kv, m.scatter = is_scatter, m.add = add;
    m.inner = g;
    m.inner.rows = lu_ * s_.u;
    m.outer = g;
    m.outer.rows = lu_;
    m.outer.heads = kv ? s_.job_kv_heads : s_.heads.total;
    return m;
  }
  Move scatter(const char* name, const void* outer, void* inner, Geom g, bool kv) const {
    return make_move(name, outer, inner, g, kv, true, false);
  }
  Move gather(const char* name, const void* inner, void* outer, Geom g, bool kv, bool add) const {
    return make_move(name, inner, outer, g, kv, false, add);
  }

  // The heads of member m's slice, as the job numbers them.
  Box heads_of(int m, bool kv, int64_t rows) const {
    const int64_t c = kv ? s_.cfg.effective_kv_heads() : s_.cfg.shape.heads;
    const int64_t h0 = kv ? s_.kv_first_of(m) : m * c;
    return {0, rows, h0, c};
  }

  void run(std::vector<Move> moves, A2aTimes& t) {
    const int u = s_.u, me = s_.member;
    struct Posted {
      std::unique_ptr<ring::PendingExchange> ex;
      char* send = nullptr;
      char* recv = nullptr;
      std::size_t slot = 0;
      Clock::time_point at;
    };
    std::vector<Posted> posted(moves.size());
    char* send_at = send_arena_;
    char* recv_at = recv_arena_;
    Clock::time_point t0 = Clock::now();
    double waited = 0;
    for (std::size_t i = 0; i < moves.size(); ++i) {
      const Move& mv = moves[i];
      const Box box0 = mv.scatter ? heads_of(0, mv.kv, lu_) : Box{0, lu_, 0, mv.inner.heads};
      Posted& p = posted[i];
      p.slot = block_bytes(mv.outer, box0);
      p.send = send_at, p.recv = recv_at;
      send_at += p.slot * static_cast<std::size_t>(u);
      recv_at += p.slot * static_cast<std::size_t>(u);
      for (int m = 0; m < u; ++m) {
        void* slot = p.send + p.slot * static_cast<std::size_t>(m);
        if (mv.scatter)
          pack(*moves_, mv.outer, mv.src, heads_of(m, mv.kv, lu_), slot);
        else
          pack(*moves_, mv.inner, mv.src, {m * lu_, lu_, 0, mv.inner.heads}, slot);
      }
      std::vector<ring::Transfer> sends, recvs;
      for (int m = 0; m < u; ++m) {
        if (m == me) continue;
        const std::size_t off = p.slot * static_cast<std::size_t>(m);
        sends.push_back({m, p.send + off, p.slot});
        recvs.push_back({m, p.recv + off, p.slot});
        t.bytes += static_cast<int64_t>(p.slot);
      }
      moves_->before_exchange(*group_);
      p.at = Clock::now();
      p.ex = group_->start(sends, recvs, kTagBase + static_cast<int>(i));
    }
    for (std::size_t i = 0; i < moves.size(); ++i) {
      const Move& mv = moves[i];
      Posted& p = posted[i];
      const Clock::time_point w = Clock::now();
      wait(*p.ex, mv.name);
      waited += ms_since(w);
      t.comm_ms += ms_since(p.at);
      moves_->after_exchange(*p.ex);
      if (mv.add) zero_outer(mv);
      for (int m = 0; m < u; ++m) {
        const char* block = (m == me ? p.send : p.recv) + p.slot * static_cast<std::size_t>(m);
        if (mv.scatter)
          unpack(*moves_, mv.inner, mv.dst, {m * lu_, lu_, 0, mv.inner.heads}, block, false);
        else
          unpack(*moves_, mv.outer, mv.dst, heads_of(m, mv.kv, lu_), block, mv.add);
      }
    }
    t.exposed_ms += waited;
    t.compute_ms += ms_since(t0) - waited;
  }

  void zero_outer(const Move& mv) {
    const Geom& g = mv.outer;
    moves_->zero(mv.dst, static_cast<std::size_t>(g.batch * g.rows * g.heads * g.width) * g.elem);
  }

  void wait(ring::PendingExchange& ex, const char* tensor) {
    const Clock::time_point deadline =
        Clock::now() +
        std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s_));
    while (!ex.test()) {
      comm_.check_aborted();
      if (Clock::now() > deadline) {
        std::ostringstream msg;
        msg << "the Ulysses all-to-all of " << tensor << " did not complete within " << timeout_s_
            << " s (timeout_s): its group is ranks " << group_->job_rank(0) << ".."
            << group_->job_rank(s_.u - 1) << "; a peer has stalled or died";
        if (std::string lib = comm_.cancel_in_flight(); !lib.empty()) msg << "; " << lib;
        throw RuntimeFailure(msg.str());
      }
      std::this_thread::yield();
    }
  }

  static void add_pass(PassStats& p, const A2aTimes& t) {
    p.compute_ms += t.compute_ms;
    p.comm_ms += t.comm_ms;
    p.comm_exposed_ms += t.exposed_ms;
    p.bytes_sent += t.bytes;
  }

  void allocate() {
    const Shape4& sh = s_.cfg.shape;
    const int64_t rows = lu_ * s_.u;
    const auto n = static_cast<std::size_t>(sh.batch * rows * sh.heads * sh.head_dim);
    const auto n_kv =
        static_cast<std::size_t>(sh.batch * rows * s_.cfg.effective_kv_heads() * sh.head_dim);
    const auto dv_per_d = [&](std::size_t x) {
      return x / static_cast<std::size_t>(sh.head_dim) *
             static_cast<std::size_t>(s_.cfg.effective_head_dim_v());
    };
    const std::size_t n_out = dv_per_d(n), n_v = dv_per_d(n_kv);
    const auto n_lse = static_cast<std::size_t>(sh.batch * rows * sh.heads);
    auto take = [&](std::size_t bytes, const char* what) {
      staging_bytes_ += bytes;
      return moves_->allocate(bytes, what);
    };
    q_in_ = take(n * eb_, "q (Ulysses slice)");
    k_in_ = take(n_kv * eb_, "k (Ulysses slice)");
    v_in_ = take(n_v * eb_, "v (Ulysses slice)");
    dout_in_ = take(n_out * eb_, "dout (Ulysses slice)");
    out_in_ = take(n_out * 4, "out (Ulysses slice)");
    lse_in_ = take(n_lse * 4, "lse (Ulysses slice)");
    dq_in_ = take(n * 4, "dq (Ulysses slice)");
    dk_in_ = take(n_kv * 4, "dk (Ulysses slice)");
    dv_in_ = take(n_v * 4, "dv (Ulysses slice)");
    // Send and receive slots of the largest move list: the backward's six inputs, or its
    // three gradients (fp32).
    const std::size_t arena = std::max((n + n_kv + n_v + n_out) * eb_ + (n_out + n_lse) * 4,
                                       (n + n_kv + n_v) * 4);
    send_arena_ = static_cast<char*>(take(arena, "Ulysses all-to-all send slots"));
    recv_arena_ = static_cast<char*>(take(arena, "Ulysses all-to-all receive slots"));
  }

  UlyssesSlice s_;
  int64_t lu_ = 0;  // this rank's rows
  ring::Communicator& comm_;
  std::unique_ptr<ring::Communicator> group_, ring_;
  std::unique_ptr<Backend> inner_;
  std::unique_ptr<Moves> moves_;
  double timeout_s_ = 300;
  std::size_t eb_ = 4;
  std::size_t staging_bytes_ = 0;
  void *q_in_ = nullptr, *k_in_ = nullptr, *v_in_ = nullptr, *dout_in_ = nullptr;
  void *out_in_ = nullptr, *lse_in_ = nullptr, *dq_in_ = nullptr, *dk_in_ = nullptr,
       *dv_in_ = nullptr;
  char *send_arena_ = nullptr, *recv_arena_ = nullptr;
  A2aTimes fwd_, bwd_;
};

}  // namespace

std::string ulysses_head_split_problem(int64_t heads, int64_t kv_heads, int u) {
  if (u < 1) return "must be at least 1, got " + std::to_string(u);
  if (heads % u != 0)
    return std::to_string(u) + " does not divide the " + std::to_string(heads) +
           " heads (config.shape.heads): each rank of a group computes heads / U of them";
  const int64_t per_rank = heads / u, per_kv = heads / kv_heads;
  if (kv_heads % u == 0 || per_kv % per_rank == 0) return "";
  return std::to_string(u) + " ranks would split the " + std::to_string(kv_heads) +
         " K/V heads (config.kv_heads) of " + std::to_string(heads) +
         " query heads unevenly: U must divide config.kv_heads, or heads / U must divide the " +
         std::to_string(per_kv) + " query heads of each K/V head";
}

int64_t UlyssesSlice::kv_first_of(int m) const {
  if (!kv_shared) return m * cfg.effective_kv_heads();
  return m * cfg.shape.heads / (heads.total / job_kv_heads);
}

UlyssesSlice ulysses_slice(const AttentionConfig& cfg,
                           const std::shared_ptr<const sparse::BlockLists>& lists, int u,
                           int member) {
  UlyssesSlice s;
  s.u = u, s.member = member;
  s.job_kv_heads = cfg.effective_kv_heads();
  const int64_t h = cfg.shape.heads / u;
  s.kv_shared = s.job_kv_heads % u != 0;
  s.cfg = cfg;
  s.cfg.shape.heads = h;
  s.heads = {member * h, cfg.shape.heads};
  s.cfg.kv_heads = s.kv_shared ? 1 : s.job_kv_heads / u;
  if (lists) {
    auto l = std::make_shared<sparse::BlockLists>(*lists);
    l->heads = h;
    l->head_list.assign(lists->head_list.begin() + member * h,
                        lists->head_list.begin() + (member + 1) * h);
    s.lists = std::move(l);
  }
  return s;
}

int64_t ulysses_forward_a2a_bytes(const AttentionConfig& cfg, int u, int64_t local_rows,
                                  int elem_bytes) {
  const Shape4& sh = cfg.shape;
  const int64_t h = sh.heads / u;
  const int64_t hkv = cfg.effective_kv_heads() % u == 0 ? cfg.effective_kv_heads() / u : 1;
  // Per other member, this rank's rows of: q (h heads), k and v (hkv heads each) in the
  // device dtype; out (h heads, of the values' head dim) and lse (h heads, one float per
  // row) in fp32.
  const int64_t dv = cfg.effective_head_dim_v();
  const int64_t per_member =
      sh.batch * local_rows *
      ((sh.head_dim * (h + hkv) + dv * hkv) * elem_bytes + dv * h * 4 + h * 4);
  return per_member * (u - 1);
}

std::unique_ptr<Moves> make_host_moves() { return std::make_unique<HostMoves>(); }

std::unique_ptr<Backend> make_ulysses_backend(const UlyssesSlice& slice, int64_t local_rows,
                                              ring::Communicator& comm,
                                              std::unique_ptr<ring::Communicator> group,
                                              std::unique_ptr<ring::Communicator> ring_comm,
                                              std::unique_ptr<Backend> inner,
                                              std::unique_ptr<Moves> moves, double timeout_s) {
  return std::make_unique<UlyssesBackend>(slice, local_rows, comm, std::move(group),
                                          std::move(ring_comm), std::move(inner), std::move(moves),
                                          timeout_s);
}

}  // namespace ringattn::job
