// Attention sinks through the library API on the CPU engines: dense (causal zigzag, GQA with a
// window, packed documents, head-major tensors), block-sparse (with a query block that sees no
// key) and Ulysses x ring, on P = 1..4 virtual ranks. Every rank's out, lse and gradients, and
// the sinks' gradient (each rank's part through its rows, summed over the ranks), against the
// float64 reference that puts
// the sink in each row's softmax. Dilated attention and calls without the job's sinks are
// refused by name.
#include <gtest/gtest.h>

#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "job/comm_access.hpp"
#include "random.hpp"
#include "ring/inproc_communicator.hpp"
#include "ringattn/reference.hpp"
#include "ringattn/ringattn.hpp"

namespace ringattn {
namespace {

constexpr double kTolerance = 2e-6;
constexpr float kNoSink = -std::numeric_limits<float>::infinity();

struct SinkCase {
  std::string name;
  AttentionConfig cfg;
  int ranks = 1;
  int ulysses = 1;
  std::vector<uint8_t> mask;  // block-sparse: [nb, nb]
};

SinkCase make(std::string name, const AttentionConfig& cfg, int ranks, int ulysses = 1,
              std::vector<uint8_t> mask = {}) {
  return {std::move(name), cfg, ranks, ulysses, std::move(mask)};
}

std::vector<SinkCase> cases() {
  std::vector<SinkCase> c;
  AttentionConfig dense;
  dense.shape = {2, 96, 4, 16};
  for (const int p : {1, 3}) c.push_back(make("dense_P" + std::to_string(p), dense, p));
  AttentionConfig causal = dense;
  causal.causal = true;
  for (const int p : {1, 2, 4}) c.push_back(make("causal_P" + std::to_string(p), causal, p));
  AttentionConfig gqa = causal;
  gqa.kv_heads = 2;
  gqa.window_left = 9;
  c.push_back(make("gqa_window_P2", gqa, 2));
  AttentionConfig packed = causal;
  packed.cu_seqlens = {0, 1, 30, 96};  // a one-token document
  c.push_back(make("packed_P2", packed, 2));
  AttentionConfig head_major = dense;
  head_major.layout = TensorLayout::bhnd;
  c.push_back(make("head_major_P1", head_major, 1));
  c.push_back(make("ulysses_U2_P2", gqa, 2, 2));
  c.push_back(make("ulysses_U2_P4", causal, 4, 2));
  AttentionConfig sparse = dense;
  sparse.attention = AttentionKind::block_sparse;
  sparse.block_size = 8;
  const int64_t nb = sparse.shape.seq_len / sparse.block_size;
  std::vector<uint8_t> mask(static_cast<std::size_t>(nb * nb), 0);
  for (int64_t i = 0; i < nb; ++i)
    for (int64_t j = 0; j < nb; ++j)
      mask[static_cast<std::size_t>(i * nb + j)] = i != 2 && (j == 0 || (i * 3 + j) % 4 == 0);
  for (const int p : {1, 2})
    c.push_back(make("block_sparse_P" + std::to_string(p), sparse, p, 1, mask));
  // Values of their own head dim and soft-capped scores: the sink joins the capped scores'
  // softmax uncapped, and its epilogue and gradient read rows of Dv.
  AttentionConfig mla = gqa;
  mla.head_dim_v = 8;
  mla.softcap = 5;
  for (const int p : {1, 2}) c.push_back(make("mla_softcap_P" + std::to_string(p), mla, p));
  c.push_back(make("mla_softcap_ulysses_U2_P2", mla, 2, 2));
  AttentionConfig mla_hm = mla;
  mla_hm.layout = TensorLayout::bhnd;
  mla_hm.kv_heads.reset();
  mla_hm.window_left.reset();
  c.push_back(make("mla_softcap_head_major_P1", mla_hm, 1));
  return c;
}

// Element (b, p, h, 0) of a full [B, N, H, width] tensor laid out as cfg.layout says.
std::size_t at(const AttentionConfig& cfg, int64_t heads, int64_t width, int64_t b, int64_t p,
               int64_t h) {
  const Shape4& s = cfg.shape;
  if (cfg.layout == TensorLayout::bhnd)
    return static_cast<std::size_t>(((b * heads + h) * s.seq_len + p) * width);
  return static_cast<std::size_t>(((b * s.seq_len + p) * heads + h) * width);
}

// The rows `rows` of a full tensor, as a local [B, rows, heads, d] shard in cfg's layout.
template <typename T>
std::vector<float> shard(const AttentionConfig& cfg, const std::vector<T>& full, int64_t heads,
                         const std::vector<int64_t>& rows, int64_t d) {
  const auto n = static_cast<int64_t>(rows.size());
  std::vector<float> local(static_cast<std::size_t>(cfg.shape.batch * n * heads * d));
  for (int64_t b = 0; b < cfg.shape.batch; ++b)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t h = 0; h < heads; ++h) {
        AttentionConfig lc = cfg;
        lc.shape.seq_len = n;
        const std::size_t to = at(lc, heads, d, b, i, h), from = at(cfg, heads, d, b, rows[i], h);
        for (int64_t c = 0; c < d; ++c)
          local[to + static_cast<std::size_t>(c)] =
              static_cast<float>(full[from + static_cast<std::size_t>(c)]);
      }
  return local;
}

std::vector<float> lse_shard(const AttentionConfig& cfg, const std::vector<double>& full,
                             const std::vector<int64_t>& rows) {
  std::vector<float> local;
  for (int64_t bh = 0; bh < cfg.shape.batch * cfg.shape.heads; ++bh)
    for (const int64_t p : rows)
      local.push_back(
          static_cast<float>(full[static_cast<std::size_t>(bh * cfg.shape.seq_len + p)]));
  return local;
}

// Reference inputs are the same [B, N, H, d] values whatever the layout.
std::vector<float> to_rows(const AttentionConfig& cfg, const std::vector<float>& x, int64_t heads,
                           int64_t d) {
  if (cfg.layout == TensorLayout::bnhd) return x;
  AttentionConfig rows_cfg = cfg;
  rows_cfg.layout = TensorLayout::bnhd;
  std::vector<float> r(x.size());
  for (int64_t b = 0; b < cfg.shape.batch; ++b)
    for (int64_t p = 0; p < cfg.shape.seq_len; ++p)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t c = 0; c < d; ++c)
          r[at(rows_cfg, heads, d, b, p, h) + static_cast<std::size_t>(c)] =
              x[at(cfg, heads, d, b, p, h) + static_cast<std::size_t>(c)];
  return r;
}

class Sinks : public ::testing::TestWithParam<SinkCase> {};

TEST_P(Sinks, EveryRanksShardAndTheSinksGradientMatchTheFloat64Reference) {
  const SinkCase& c = GetParam();
  const AttentionConfig& cfg = c.cfg;
  const Shape4& s = cfg.shape;
  const int64_t hkv = cfg.effective_kv_heads();
  const int64_t d = s.head_dim, dv = cfg.effective_head_dim_v();
  JobSpec spec;
  spec.config = cfg;
  spec.device = Device::cpu;
  spec.threads = 1;
  spec.timeout_s = 60;
  spec.ulysses = c.ulysses;
  spec.sinks = true;
  const int64_t nb = s.seq_len / cfg.block_size;
  if (!c.mask.empty()) {
    spec.block_sparse.mask = std::make_shared<const std::vector<uint8_t>>(c.mask);
    spec.block_sparse.mask_dims = {nb, nb};
  }
  const auto q = testing::random_normal(static_cast<std::size_t>(s.numel()), 21);
  const auto k =
      testing::random_normal(static_cast<std::size_t>(s.batch * s.seq_len * hkv * d), 22);
  const auto v =
      testing::random_normal(static_cast<std::size_t>(s.batch * s.seq_len * hkv * dv), 23);
  const auto dout =
      testing::random_normal(static_cast<std::size_t>(s.batch * s.seq_len * s.heads * dv), 24);
  // A strong sink, a weak one, none (-inf) and an ordinary one.
  const std::vector<float> sinks = {2.5f, -1.0f, kNoSink, 0.3f};

  std::mutex m;
  std::vector<std::string> failures;
  std::vector<std::vector<int64_t>> rows(static_cast<std::size_t>(c.ranks));
  std::vector<std::vector<float>> outs(rows.size()), lses(rows.size()), dqs(rows.size()),
      dks(rows.size()), dvs(rows.size()), dsinks(rows.size());
  const int code = ring::run_virtual_ranks(c.ranks, [&](ring::Communicator& rc) {
    Comm comm = CommAccess::borrow(rc);
    Engine e = make_engine(spec, comm);
    const auto r = static_cast<std::size_t>(comm.rank());
    rows[r] = e.local_rows();
    const auto lq = shard(cfg, q, s.heads, rows[r], d), lk = shard(cfg, k, hkv, rows[r], d),
               lv = shard(cfg, v, hkv, rows[r], dv), ld = shard(cfg, dout, s.heads, rows[r], dv);
    outs[r].resize(ld.size());
    lses[r].resize(static_cast<std::size_t>(s.batch * s.heads) * rows[r].size());
    dqs[r].resize(lq.size());
    dks[r].resize(lk.size());
    dvs[r].resize(lv.size());
    dsinks[r].resize(sinks.size());
    e.forward(lq.data(), lk.data(), lv.data(), outs[r].data(), lses[r].data(), sinks.data());
    e.backward(lq.data(), lk.data(), lv.data(), outs[r].data(), lses[r].data(), ld.data(),
               dqs[r].data(), dks[r].data(), dvs[r].data(), sinks.data(), dsinks[r].data());
    return 0;
  });
  ASSERT_EQ(code, 0);
  for (const std::string& f : failures) ADD_FAILURE() << f;

  const auto rq = to_rows(cfg, q, s.heads, d), rk = to_rows(cfg, k, hkv, d),
             rv = to_rows(cfg, v, hkv, dv), rd = to_rows(cfg, dout, s.heads, dv);
  ReferenceForward ref;
  ReferenceGradients g;
  AttentionConfig rcfg = cfg;
  rcfg.layout = TensorLayout::bnhd;
  if (c.mask.empty()) {
    ref = reference_forward(rcfg, rq.data(), rk.data(), rv.data(), sinks.data());
    g = reference_backward(rcfg, rq.data(), rk.data(), rv.data(), rd.data(), sinks.data());
  } else {
    BlockReferenceProblem pb = block_problem_of(rcfg);
    pb.key_blocks = [&](int64_t, int64_t qb) {
      std::vector<int64_t> keys;
      for (int64_t j = 0; j < nb; ++j)
        if (c.mask[static_cast<std::size_t>(qb * nb + j)]) keys.push_back(j);
      return keys;
    };
    pb.sinks = sinks;
    ref = reference_forward_blocks(pb, rq.data(), rk.data(), rv.data());
    g = reference_backward_blocks(pb, rq.data(), rk.data(), rv.data(), rd.data());
  }
  // The references are in rows; compare each rank's shard in rows too.
  const auto rows_cfg = rcfg;
  for (std::size_t r = 0; r < rows.size(); ++r) {
    AttentionConfig lc = cfg;
    lc.shape.seq_len = static_cast<int64_t>(rows[r].size());
    const auto out = to_rows(lc, outs[r], s.heads, dv), dq = to_rows(lc, dqs[r], s.heads, d),
               dk = to_rows(lc, dks[r], hkv, d), dvr = to_rows(lc, dvs[r], hkv, dv);
    const auto want_out = shard(rows_cfg, ref.out, s.heads, rows[r], dv);
    const auto want_lse = lse_shard(cfg, ref.lse, rows[r]);
    const auto want_dq = shard(rows_cfg, g.dq, s.heads, rows[r], d);
    const auto want_dk = shard(rows_cfg, g.dk, hkv, rows[r], d);
    const auto want_dv = shard(rows_cfg, g.dv, hkv, rows[r], dv);
    // Capped scores of the cap's size leave fp32 a few ulps of the cap in each.
    const double tol = cfg.softcapped() ? 5e-5 : kTolerance;
    EXPECT_LE(relative_error(out.data(), want_out.data(), out.size()), tol) << "out " << r;
    EXPECT_LE(relative_error(lses[r].data(), want_lse.data(), want_lse.size()), tol)
        << "lse " << r;
    EXPECT_LE(relative_error(dq.data(), want_dq.data(), dq.size()), tol) << "dq " << r;
    EXPECT_LE(relative_error(dk.data(), want_dk.data(), dk.size()), tol) << "dk " << r;
    EXPECT_LE(relative_error(dvr.data(), want_dv.data(), dvr.size()), tol) << "dv " << r;
    EXPECT_EQ(dsinks[r][2], 0.0f) << "a head without a sink (-inf) has no sink gradient";
  }
  std::vector<double> total(sinks.size(), 0.0);
  for (const auto& part : dsinks)
    for (std::size_t h = 0; h < sinks.size(); ++h) total[h] += part[h];
  const std::vector<float> job(total.begin(), total.end());
  ASSERT_EQ(g.dsinks.size(), sinks.size());
  EXPECT_LE(relative_error(job.data(), g.dsinks.data(), sinks.size()),
            cfg.softcapped() ? 5e-5 : kTolerance)
      << "dsinks";
}

std::string sink_case_name(const ::testing::TestParamInfo<SinkCase>& info) {
  return info.param.name;
}

INSTANTIATE_TEST_SUITE_P(Jobs, Sinks, ::testing::ValuesIn(cases()), sink_case_name);

TEST(SinksSetup, DilatedAttentionRefusesSinksNamingBothOptions) {
  JobSpec spec;
  spec.config.shape = {1, 64, 4, 16};
  spec.config.attention = AttentionKind::dilated;
  spec.config.segments = {32, 64};
  spec.config.dilations = {1, 2};
  spec.device = Device::cpu;
  spec.sinks = true;
  Comm comm = Comm::single();
  try {
    (void)make_engine(spec, comm);
    ADD_FAILURE() << "dilated attention took sinks";
  } catch (const InputError& e) {
    EXPECT_EQ(e.subject(), "sinks");
    EXPECT_NE(std::string(e.what()).find("config.attention"), std::string::npos) << e.what();
  }
}

TEST(SinksSetup, ACallWithoutTheJobsSinksOrWithSinksTheJobLacksIsRefused) {
  JobSpec spec;
  spec.config.shape = {1, 16, 4, 8};
  spec.device = Device::cpu;
  spec.sinks = true;
  Comm comm = Comm::single();
  Engine e = make_engine(spec, comm);
  std::vector<float> x(16 * 4 * 8), out(x.size()), lse(16 * 4), sinks(4, 0.0f);
  EXPECT_THROW(e.forward(x.data(), x.data(), x.data(), out.data(), lse.data()), InputError);
  e.forward(x.data(), x.data(), x.data(), out.data(), lse.data(), sinks.data());
  std::vector<float> dq(x.size()), dk(x.size()), dv(x.size());
  try {
    e.backward(x.data(), x.data(), x.data(), out.data(), lse.data(), x.data(), dq.data(), dk.data(),
               dv.data(), sinks.data());
    ADD_FAILURE() << "a backward with sinks and nowhere for their gradient was accepted";
  } catch (const InputError& err) {
    EXPECT_EQ(err.subject(), "dsinks");
  }
  spec.sinks = false;
  Engine plain = make_engine(spec, comm);
  try {
    plain.forward(x.data(), x.data(), x.data(), out.data(), lse.data(), sinks.data());
    ADD_FAILURE() << "sinks given to a job without them were accepted";
  } catch (const InputError& err) {
    EXPECT_EQ(err.subject(), "sinks");
  }
}

}  // namespace
}  // namespace ringattn
