// A distributed consumer of the installed ringattn package: run under `mpirun -n P`. Each
// rank holds its shard of the sequence (Engine::local_rows(): zigzag for causal jobs) and the
// ring brings it every other rank's K/V. Two jobs go through make_engine: causal dense
// attention and LongNet-style dilated attention (grouped, three patterns), forward and
// backward, each checked on every rank against the library's float64 reference of the whole
// problem. Uses only the public headers (<ringattn/ringattn.hpp>, <ringattn/mpi.hpp>).
// Exit 0 when every rank is within tolerance.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <ringattn/mpi.hpp>
#include <ringattn/reference.hpp>
#include <ringattn/ringattn.hpp>
#include <vector>

namespace {

// Rows `rows` (global positions) of a [B, N, heads, D] tensor, or back.
void take_rows(const std::vector<float>& full, const std::vector<int64_t>& rows, int64_t batch,
               int64_t seq_len, int64_t inner, std::vector<float>& local) {
  local.resize(static_cast<std::size_t>(batch) * rows.size() * static_cast<std::size_t>(inner));
  for (int64_t b = 0; b < batch; ++b)
    for (std::size_t i = 0; i < rows.size(); ++i)
      std::copy_n(
          full.data() + (b * seq_len + rows[i]) * inner, inner,
          local.data() + (b * static_cast<int64_t>(rows.size()) + static_cast<int64_t>(i)) * inner);
}

// The largest relative error of this rank's rows of `got` against the reference `want`.
double error_of(const std::vector<float>& got, const std::vector<double>& want,
                const std::vector<int64_t>& rows, int64_t batch, int64_t seq_len, int64_t inner) {
  std::vector<float> want_local;
  const std::vector<float> want_f(want.begin(), want.end());
  take_rows(want_f, rows, batch, seq_len, inner, want_local);
  return ringattn::relative_error(got.data(), want_local.data(), got.size());
}

// Runs `cfg` on every rank of `comm`; returns this rank's worst relative error.
double run_job(const char* name, const ringattn::AttentionConfig& cfg, ringattn::Comm& comm) {
  ringattn::JobSpec spec;
  spec.config = cfg;
  spec.device = ringattn::Device::cpu;
  spec.timeout_s = 60;
  ringattn::Engine engine = ringattn::make_engine(spec, comm);

  // The whole problem, the same on every rank (a fixed seed); each rank keeps its rows.
  const ringattn::Shape4& s = cfg.shape;
  const auto n = static_cast<std::size_t>(s.numel());
  std::vector<float> q(n), k(n), v(n), dout(n);
  std::mt19937 gen(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto* t : {&q, &k, &v, &dout})
    for (float& x : *t) x = normal(gen);
  const std::vector<int64_t> rows = engine.local_rows();
  const int64_t inner = s.heads * s.head_dim;
  std::vector<float> lq, lk, lv, ldout;
  take_rows(q, rows, s.batch, s.seq_len, inner, lq);
  take_rows(k, rows, s.batch, s.seq_len, inner, lk);
  take_rows(v, rows, s.batch, s.seq_len, inner, lv);
  take_rows(dout, rows, s.batch, s.seq_len, inner, ldout);

  const std::size_t nl = lq.size();
  std::vector<float> out(nl), dq(nl), dk(nl), dv(nl);
  std::vector<float> lse(static_cast<std::size_t>(s.batch * s.heads) * rows.size());
  engine.forward(lq.data(), lk.data(), lv.data(), out.data(), lse.data());
  engine.backward(lq.data(), lk.data(), lv.data(), out.data(), lse.data(), ldout.data(), dq.data(),
                  dk.data(), dv.data());

  const ringattn::ReferenceForward ref =
      ringattn::reference_forward(cfg, q.data(), k.data(), v.data());
  const ringattn::ReferenceGradients g =
      ringattn::reference_backward(cfg, q.data(), k.data(), v.data(), dout.data());
  double worst = 0;
  const char* names[] = {"out", "dq", "dk", "dv"};
  const std::vector<float>* got[] = {&out, &dq, &dk, &dv};
  const std::vector<double>* want[] = {&ref.out, &g.dq, &g.dk, &g.dv};
  for (int i = 0; i < 4; ++i) {
    const double e = error_of(*got[i], *want[i], rows, s.batch, s.seq_len, inner);
    std::printf("rank %d: %s %s relative error %.2e\n", comm.rank(), name, names[i], e);
    worst = std::max(worst, e);
  }
  const ringattn::EngineStats st = engine.stats();
  if (comm.rank() == 0)
    std::printf("%s: %s on %d ranks (%s layout), forward sent %lld bytes (minimum %lld)\n", name,
                st.engine.c_str(), st.world_size, st.layout.c_str(),
                static_cast<long long>(st.bytes_sent), static_cast<long long>(st.bytes_sent_min));
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int code = 0;
  try {
    ringattn::Comm comm = ringattn::mpi_comm(MPI_COMM_WORLD);
    ringattn::AttentionConfig causal;
    causal.shape = {1, 512, 4, 32};  // [B, N, H, D]; N a multiple of 2P for the zigzag
    causal.causal = true;
    ringattn::AttentionConfig dilated;
    dilated.shape = {1, 512, 6, 32};
    dilated.attention = ringattn::AttentionKind::dilated;
    dilated.segments = {128, 256, 512};
    dilated.dilations = {1, 2, 4};
    double worst =
        std::max(run_job("causal dense", causal, comm), run_job("dilated grouped", dilated, comm));
    MPI_Allreduce(MPI_IN_PLACE, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    const double tolerance = 1e-5;
    if (comm.rank() == 0)
      std::printf("worst relative error over ranks %.2e (tolerance %.0e): %s\n", worst, tolerance,
                  worst <= tolerance ? "OK" : "NOT OK");
    code = worst <= tolerance ? 0 : 1;
  } catch (const ringattn::InputError& e) {
    std::fprintf(stderr, "bad job: %s\n", e.what());
    code = 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "failed: %s\n", e.what());
    code = 3;
  }
  MPI_Finalize();
  return code;
}
