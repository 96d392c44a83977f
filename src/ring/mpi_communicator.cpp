// The MPI backend of the communicator: nonblocking point-to-point over host memory, split
// into pieces below MPI's int count limit, and the collectives the CLI needs. Every MPI call
// is checked and a failure throws with file:line, the rank and MPI's own message.
#include "ring/mpi_communicator.hpp"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ring/communicator.hpp"
#include "ringattn/errors.hpp"

#define RINGATTN_MPI_CHECK(call)                                                        \
  do {                                                                                  \
    const int rc_ = (call);                                                             \
    if (rc_ != MPI_SUCCESS) ::ringattn::ring::mpi_fail(rc_, #call, __FILE__, __LINE__); \
  } while (0)

namespace ringattn::ring {

[[noreturn]] void mpi_fail(int rc, const char* what, const char* file, int line) {
  char msg[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  throw RuntimeFailure(std::string(file) + ":" + std::to_string(line) + ": rank " +
                       std::to_string(rank) + ": " + what + " failed: " + msg);
}

namespace {

constexpr std::size_t kPiece = std::size_t{1} << 30;  // bytes per MPI message piece

class MpiExchange final : public PendingExchange {
 public:
  std::vector<MPI_Request> requests;
  bool test() override {
    if (requests.empty()) return true;
    int done = 0;
    RINGATTN_MPI_CHECK(MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done,
                                   MPI_STATUSES_IGNORE));
    if (done) requests.clear();
    return done != 0;
  }
  ~MpiExchange() override {
    // A pending exchange abandoned by an exception: the job is being aborted anyway.
    for (auto& r : requests)
      if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
  }
};

class MpiCommunicator final : public Communicator {
 public:
  // Initialises MPI (thread level MULTIPLE) and runs on MPI_COMM_WORLD; finalises MPI on
  // destruction.
  MpiCommunicator(int* argc, char*** argv) : owns_mpi_(true) {
    int provided = 0;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
      throw RuntimeFailure("MPI_Init_thread failed");
    comm_ = MPI_COMM_WORLD;
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    set_up(provided);
  }
  // Runs on a duplicate of the caller's communicator (so its messages never match the
  // caller's own); MPI stays the caller's to finalise.
  explicit MpiCommunicator(MPI_Comm comm) : owns_mpi_(false) {
    int initialised = 0, finalised = 0;
    MPI_Initialized(&initialised);
    MPI_Finalized(&finalised);
    if (!initialised || finalised)
      throw RuntimeFailure(
          "ringattn::mpi_comm: MPI is not initialised (call MPI_Init_thread "
          "first, and keep MPI running while the engine lives)");
    int provided = 0;
    MPI_Query_thread(&provided);
    RINGATTN_MPI_CHECK(MPI_Comm_dup(comm, &comm_));
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    set_up(provided);
  }
  ~MpiCommunicator() override {
    if (owns_mpi_)
      MPI_Finalize();
    else
      MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  std::string library_version() const override {
    char v[MPI_MAX_LIBRARY_VERSION_STRING] = {};
    int len = 0;
    MPI_Get_library_version(v, &len);
    std::string s(v, static_cast<std::size_t>(len));
    if (auto nl = s.find_first_of("\r\n,"); nl != std::string::npos) s.resize(nl);
    return s;
  }

  std::unique_ptr<PendingExchange> start(std::span<const Transfer> sends,
                                         std::span<const Transfer> recvs, int tag) override {
    auto ex = std::make_unique<MpiExchange>();
    auto post = [&](const Transfer& t, bool send) {
      auto* p = static_cast<char*>(t.data);
      for (std::size_t off = 0; off < t.bytes; off += kPiece) {
        const int n = static_cast<int>(std::min(kPiece, t.bytes - off));
        MPI_Request r;
        if (send)
          RINGATTN_MPI_CHECK(MPI_Isend(p + off, n, MPI_BYTE, t.peer, tag, comm_, &r));
        else
          RINGATTN_MPI_CHECK(MPI_Irecv(p + off, n, MPI_BYTE, t.peer, tag, comm_, &r));
        ex->requests.push_back(r);
      }
    };
    for (const Transfer& t : recvs) post(t, false);
    for (const Transfer& t : sends) post(t, true);
    return ex;
  }

  void set_collective_timeout(double seconds) override { timeout_s_ = seconds; }

  void barrier() override {
    MPI_Request r = MPI_REQUEST_NULL;
    RINGATTN_MPI_CHECK(MPI_Ibarrier(comm_, &r));
    wait_all({&r, 1}, "barrier", "all ranks");
  }
  int64_t max(int64_t v) override {
    int64_t out = 0;
    MPI_Request r = MPI_REQUEST_NULL;
    RINGATTN_MPI_CHECK(MPI_Iallreduce(&v, &out, 1, MPI_INT64_T, MPI_MAX, comm_, &r));
    wait_all({&r, 1}, "max over ranks", "all ranks");
    return out;
  }
  double max(double v) override {
    double out = 0;
    MPI_Request r = MPI_REQUEST_NULL;
    RINGATTN_MPI_CHECK(MPI_Iallreduce(&v, &out, 1, MPI_DOUBLE, MPI_MAX, comm_, &r));
    wait_all({&r, 1}, "max over ranks", "all ranks");
    return out;
  }
  void gather(const void* data, std::size_t bytes, void* out) override {
    constexpr int kTag = 1 << 14;
    std::vector<MPI_Request> reqs;
    if (rank_ != 0) {
      const auto* p = static_cast<const char*>(data);
      for (std::size_t off = 0; off < bytes; off += kPiece) {
        reqs.push_back(MPI_REQUEST_NULL);
        RINGATTN_MPI_CHECK(MPI_Isend(p + off, static_cast<int>(std::min(kPiece, bytes - off)),
                                     MPI_BYTE, 0, kTag, comm_, &reqs.back()));
      }
      wait_all(reqs, "gather to rank 0", "rank 0");
      return;
    }
    auto* o = static_cast<char*>(out);
    if (bytes) std::memcpy(o, data, bytes);
    for (int src = 1; src < size_; ++src)
      for (std::size_t off = 0; off < bytes; off += kPiece) {
        reqs.push_back(MPI_REQUEST_NULL);
        RINGATTN_MPI_CHECK(MPI_Irecv(o + static_cast<std::size_t>(src) * bytes + off,
                                     static_cast<int>(std::min(kPiece, bytes - off)), MPI_BYTE, src,
                                     kTag, comm_, &reqs.back()));
      }
    wait_all(reqs, "gather to rank 0", "ranks 1.." + std::to_string(size_ - 1));
  }
  void broadcast(void* data, std::size_t bytes, int root) override {
    auto* p = static_cast<char*>(data);
    for (std::size_t off = 0; off < bytes; off += kPiece) {
      MPI_Request r = MPI_REQUEST_NULL;
      RINGATTN_MPI_CHECK(MPI_Ibcast(p + off, static_cast<int>(std::min(kPiece, bytes - off)),
                                    MPI_BYTE, root, comm_, &r));
      wait_all({&r, 1}, "broadcast from rank " + std::to_string(root), "all ranks");
    }
  }
  std::vector<RankInfo> gather_info(const RankInfo& mine) override {
    constexpr std::size_t kField = 128;
    char buf[kField * 2] = {};
    std::snprintf(buf, kField, "%s", mine.host.c_str());
    std::snprintf(buf + kField, kField, "%s", mine.device.c_str());
    int nums[2] = {mine.pid, mine.local_rank};
    std::vector<char> all_buf(rank_ == 0 ? sizeof buf * static_cast<std::size_t>(size_) : 0);
    std::vector<int> all_nums(rank_ == 0 ? 2 * static_cast<std::size_t>(size_) : 0);
    MPI_Request reqs[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    RINGATTN_MPI_CHECK(MPI_Igather(buf, sizeof buf, MPI_CHAR, all_buf.data(), sizeof buf, MPI_CHAR,
                                   0, comm_, &reqs[0]));
    RINGATTN_MPI_CHECK(
        MPI_Igather(nums, 2, MPI_INT, all_nums.data(), 2, MPI_INT, 0, comm_, &reqs[1]));
    wait_all(reqs, "gather of rank facts", "all ranks");
    std::vector<RankInfo> out;
    for (int r = 0; rank_ == 0 && r < size_; ++r) {
      const char* b = all_buf.data() + static_cast<std::size_t>(r) * sizeof buf;
      out.push_back({std::string(b), all_nums[2 * static_cast<std::size_t>(r)],
                     all_nums[2 * static_cast<std::size_t>(r) + 1], std::string(b + kField)});
    }
    return out;
  }
  [[noreturn]] void abort(int exit_code) override {
    MPI_Abort(MPI_COMM_WORLD, exit_code);
    std::_Exit(exit_code);
  }

 private:
  // MPI_Waitall with the watchdog's deadline (set_collective_timeout): a blocking collective
  // would wait forever for a rank behind a dead link. Spins briefly (collectives between
  // ring steps are short), then polls every 100 us so that a long wait costs no core.
  void wait_all(std::span<MPI_Request> reqs, const std::string& what, const std::string& peers) {
    using clock = std::chrono::steady_clock;
    const auto deadline = clock::now() + std::chrono::duration_cast<clock::duration>(
                                             std::chrono::duration<double>(timeout_s_));
    for (int polls = 0;; ++polls) {
      int done = 0;
      RINGATTN_MPI_CHECK(
          MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE));
      if (done) return;
      if (clock::now() > deadline) {
        std::ostringstream os;
        os << what << " did not complete within " << timeout_s_ << " s (timeout_s), waiting for "
           << peers << "; a peer has stalled, died or is unreachable";
        throw RuntimeFailure(os.str());
      }
      if (polls > 10000) std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  void set_up(int provided) {
    RINGATTN_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    RINGATTN_MPI_CHECK(MPI_Comm_size(comm_, &size_));
    if (provided < MPI_THREAD_SERIALIZED)
      throw RuntimeFailure("the MPI library provides thread level " + std::to_string(provided) +
                           "; ringattn's communication thread needs MPI_THREAD_SERIALIZED");
    MPI_Comm node;
    RINGATTN_MPI_CHECK(
        MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
    RINGATTN_MPI_CHECK(MPI_Comm_rank(node, &local_rank_));
    MPI_Comm_free(&node);
  }

  bool owns_mpi_ = false;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1, local_rank_ = 0;
  double timeout_s_ = 300;  // JobSpec::timeout_s's default until the front end sets it
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(int* argc, char*** argv) {
  return std::make_unique<MpiCommunicator>(argc, argv);
}

std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm) {
  return std::make_unique<MpiCommunicator>(comm);
}

}  // namespace ringattn::ring
