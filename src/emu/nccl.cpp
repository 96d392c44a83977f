// The emulated NCCL (cuda_shim/nccl.h): communicators whose ranks are host threads of this
// process, each bound to its own emulated device. A unique id names a rendezvous (a clique)
// in a process-wide registry. A group of sends and receives becomes one task on its stream
// that publishes its sends, copies each receive from the matching send, then waits until
// its own sends have been taken, so ranks that all send before they receive cannot deadlock.
#include <nccl.h>

#include <algorithm>
#include <compare>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "emu/runtime.hpp"

namespace ringattn::emu::nccl {

// One send, published by its rank's stream task; the receiver copies from it while the
// sender's task waits, so the buffer stays valid until the state is `taken`.
struct Post {
  Post(const void* d, std::size_t n) : data(d), bytes(n) {}
  const void* data;
  std::size_t bytes;
  enum class State { posted, copying, taken } state = State::posted;
  std::string refused;  // why the receiver refused it; empty when it was copied
};

// Sends and receives between a pair of ranks match in issue order: the k-th send from
// `from` to `to` goes to the k-th receive `to` posts from `from`.
struct PostKey {
  int from, to;
  std::uint64_t seq;
  auto operator<=>(const PostKey&) const = default;
};

// One rank's communicator.
struct Member {
  bool joined = false;
  int device = -1;
  bool blocking = true;
  ncclResult_t error = ncclSuccess;  // the first asynchronous error
  std::string last_error;
  // Why this rank takes no further part ("aborted its communicator", ...); empty while it
  // does. Peers waiting on a gone rank fail instead of waiting for ever.
  std::string gone;
  bool aborted = false;
  bool finalizing = false;
  int queued = 0;   // stream tasks enqueued and not yet ended or dropped
  int running = 0;  // of those, the ones inside their body now
  std::vector<std::uint64_t> sends_issued, recvs_issued;  // per peer
};

struct Clique {
  explicit Clique(int n) : nranks(n), members(static_cast<std::size_t>(n)) {}
  int nranks;
  int joined = 0;
  ncclResult_t refused = ncclSuccess;  // the initialisation failed, for every rank
  std::vector<Member> members;
  std::map<PostKey, std::shared_ptr<Post>> posts;
  bool complete() const { return joined == nranks && refused == ncclSuccess; }
};

}  // namespace ringattn::emu::nccl

struct ncclComm {
  std::shared_ptr<ringattn::emu::nccl::Clique> clique;  // also held by the comm's stream tasks
  int rank;
};

namespace ringattn::emu::nccl {
namespace {

// All of the emulated NCCL's state, under one mutex: the waits of stream tasks and host
// calls are on one condition variable, notified on every change, which is plenty for a
// handful of ranks. Never call into the runtime while holding `mu`: the runtime may drop
// a stream task (running GroupTask's destructor, which takes `mu`) under its own lock.
struct Registry {
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, std::shared_ptr<Clique>> forming;  // by unique id, until complete
  std::set<std::string> spent;  // ids of complete communicators: NCCL's ids are single-use
  std::map<ncclComm*, std::unique_ptr<ncclComm>> handles;  // live communicators
  std::string last_error;                                  // the process's most recent
  std::uint64_t ids_issued = 0;
};

// Never destroyed: stream workers may still run a task (and take `mu`) while static
// objects are destroyed at exit.
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

std::string rank_name(int rank) { return "rank " + std::to_string(rank); }
std::string peer_name(int peer) { return "peer " + std::to_string(peer); }

// Records an error that a call returns; `m` may be null (no communicator involved).
ncclResult_t refuse(Registry& r, Member* m, ncclResult_t code, const std::string& what) {
  r.last_error = what;
  if (m) m->last_error = what;
  return code;
}

// Records an asynchronous failure of a rank (ncclCommGetAsyncError reports it) and makes
// it gone, so that peers waiting on it fail too.
void fail(Registry& r, Member& m, ncclResult_t code, const std::string& what) {
  if (m.error == ncclSuccess) m.error = code;
  m.last_error = what;
  r.last_error = what;
  if (m.gone.empty()) m.gone = "failed (" + what + ")";
  r.cv.notify_all();
}

// The initialisation fails for every rank that joined and every rank that will.
void refuse_clique(Registry& r, Clique& c, ncclResult_t code, const std::string& what) {
  c.refused = code;
  for (Member& m : c.members)
    if (m.joined && m.error == ncclSuccess) {
      m.error = code;
      m.last_error = what;
    }
  r.last_error = what;
  r.cv.notify_all();
}

struct Found {
  Clique* clique = nullptr;
  Member* member = nullptr;
  int rank = -1;
};
Found find(Registry& r, ncclComm_t comm) {
  const auto it = r.handles.find(comm);
  if (it == r.handles.end()) return {};
  Clique& c = *it->second->clique;
  return {&c, &c.members[static_cast<std::size_t>(it->second->rank)], it->second->rank};
}

std::size_t size_of(ncclDataType_t type) {
  switch (type) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
  }
  return 0;
}

// Why a communicator cannot take new work now; empty when it can.
std::pair<ncclResult_t, std::string> unusable(const Clique& c, const Member& m, int rank) {
  const std::string who = rank_name(rank) + ": ";
  if (m.aborted) return {ncclInvalidUsage, who + "the communicator was aborted"};
  if (m.error != ncclSuccess) return {m.error, m.last_error};
  if (!c.complete())
    return {ncclInvalidUsage, who +
                                  "the communicator is still initialising (poll "
                                  "ncclCommGetAsyncError until it reports ncclSuccess)"};
  if (m.finalizing) return {ncclInvalidUsage, who + "the communicator was finalized"};
  return {ncclSuccess, {}};
}

struct Transfer {
  int peer;
  std::size_t bytes;
  const void* src;  // sends
  void* dst;        // receives
  std::uint64_t seq = 0;
};

// The stream task of one group's transfers on one stream.
class GroupTask {
 public:
  GroupTask(std::shared_ptr<Clique> clique, int rank) : clique_(std::move(clique)), rank_(rank) {}
  GroupTask(const GroupTask&) = delete;
  GroupTask& operator=(const GroupTask&) = delete;
  // A task the stream dropped without running it (the device has a sticky error, or the
  // enqueue failed) must still leave the queue count, and its peers must not wait for it.
  ~GroupTask() {
    if (ran_) return;
    Registry& r = registry();
    const std::lock_guard lock(r.mu);
    Member& m = member();
    --m.queued;
    if (m.gone.empty())
      fail(r, m, ncclUnhandledCudaError,
           rank_name(rank_) + ": a send/receive group was dropped by the stream of device " +
               std::to_string(m.device) + " before it ran (a task on that device failed)");
    r.cv.notify_all();
  }

  std::vector<Transfer> sends, recvs;

  void run();

 private:
  // Publishes the sends, copies each receive from its matching send, then waits until the
  // sends are taken; `failure` says why that did not complete (empty: it did, or this rank
  // was aborted).
  void exchange(std::unique_lock<std::mutex>& lock, std::vector<std::shared_ptr<Post>>& posted,
                std::string& failure);
  Member& member() { return clique_->members[static_cast<std::size_t>(rank_)]; }
  const std::string& peer_gone(int peer) {
    return clique_->members[static_cast<std::size_t>(peer)].gone;
  }

  std::shared_ptr<Clique> clique_;
  int rank_;
  bool ran_ = false;
};

void GroupTask::run() {
  Registry& r = registry();
  std::unique_lock lock(r.mu);
  ran_ = true;
  Member& m = member();
  ++m.running;
  // Why this task's transfers did not all complete, unless it was this rank's own abort:
  // an aborted NCCL kernel simply exits, a failed transfer is a failed stream task.
  std::string failure;
  std::vector<std::shared_ptr<Post>> posted;
  if (m.gone.empty())
    exchange(lock, posted, failure);
  else if (!m.aborted)
    failure = rank_name(rank_) + ": the group's transfers did not run: " + rank_name(rank_) + " " +
              m.gone;

  // Withdraw the sends nobody took (their buffers are the caller's again once the task
  // ends) and let copies in progress finish.
  for (std::size_t i = 0; i < posted.size(); ++i)
    if (posted[i]->state == Post::State::posted)
      clique_->posts.erase({rank_, sends[i].peer, sends[i].seq});
  r.cv.wait(lock, [&] {
    for (const auto& p : posted)
      if (p->state == Post::State::copying) return false;
    return true;
  });
  --m.running;
  --m.queued;
  r.cv.notify_all();
  if (!failure.empty()) throw std::runtime_error("NCCL: " + failure);
}

void GroupTask::exchange(std::unique_lock<std::mutex>& lock,
                         std::vector<std::shared_ptr<Post>>& posted, std::string& failure) {
  Registry& r = registry();
  Clique& c = *clique_;
  Member& m = member();
  const std::string me = rank_name(rank_) + ": ";
  // A wait for `what` ended because this rank is gone: aborted (what the wait lacked becomes
  // the last error) or failed in another of its tasks.
  auto stopped = [&](const std::string& what, const std::string& lacking) {
    if (m.aborted) {
      m.last_error = me + what + ": " + lacking + " (communicator aborted)";
      r.last_error = m.last_error;
    } else {
      failure = me + what + " did not complete: " + rank_name(rank_) + " " + m.gone;
    }
  };
  auto failed = [&](ncclResult_t code, const std::string& what) {
    fail(r, m, code, me + what);
    failure = m.last_error;
  };

  for (const Transfer& t : sends) {
    auto post = std::make_shared<Post>(t.src, t.bytes);
    c.posts[{rank_, t.peer, t.seq}] = post;
    posted.push_back(std::move(post));
  }
  r.cv.notify_all();

  for (const Transfer& t : recvs) {
    const PostKey key{t.peer, rank_, t.seq};
    const std::string what = "receive #" + std::to_string(t.seq) + " of " +
                             std::to_string(t.bytes) + " bytes from " + peer_name(t.peer);
    r.cv.wait(lock, [&] {
      return !m.gone.empty() || c.posts.count(key) != 0 || !peer_gone(t.peer).empty();
    });
    if (!m.gone.empty())
      return stopped(what, peer_name(t.peer) + " never posted the matching send");
    const auto it = c.posts.find(key);
    if (it == c.posts.end())
      return failed(ncclRemoteError,
                    what + " cannot complete: " + peer_name(t.peer) + " " + peer_gone(t.peer));
    const std::shared_ptr<Post> post = it->second;
    c.posts.erase(it);
    if (post->bytes != t.bytes) {
      const std::string mismatch = what + " does not match the send of " +
                                   std::to_string(post->bytes) +
                                   " bytes (ncclSend and ncclRecv sizes must match)";
      post->refused = me + mismatch;
      post->state = Post::State::taken;
      return failed(ncclInvalidUsage, mismatch);
    }
    post->state = Post::State::copying;
    lock.unlock();
    if (t.bytes != 0) std::memcpy(t.dst, post->data, t.bytes);
    lock.lock();
    post->state = Post::State::taken;
    r.cv.notify_all();
  }

  for (std::size_t i = 0; i < posted.size(); ++i) {
    const Transfer& t = sends[i];
    const Post& post = *posted[i];
    const std::string what = "send #" + std::to_string(t.seq) + " of " + std::to_string(t.bytes) +
                             " bytes to " + peer_name(t.peer);
    r.cv.wait(lock, [&] {
      return post.state == Post::State::taken || !m.gone.empty() ||
             (post.state == Post::State::posted && !peer_gone(t.peer).empty());
    });
    if (post.state == Post::State::taken) {
      if (!post.refused.empty())
        return failed(ncclInvalidUsage, what + " was refused: " + post.refused);
    } else if (!m.gone.empty()) {
      return stopped(what, peer_name(t.peer) + " never posted the matching receive");
    } else {
      return failed(ncclRemoteError,
                    what + " cannot complete: " + peer_name(t.peer) + " " + peer_gone(t.peer));
    }
  }
}

struct Op {
  ncclComm_t comm;
  cudaStream_t stream;
  bool send;
  Transfer transfer;
};

// This host thread's open group (ncclGroupStart nests; the outermost ncclGroupEnd issues).
struct Group {
  int depth = 0;
  std::vector<Op> ops;
  ncclResult_t error = ncclSuccess;  // a call in the group failed: the group is dropped
};
thread_local Group t_group;

// Numbers the group's transfers in issue order and enqueues one task per stream.
ncclResult_t issue(std::vector<Op> ops) {
  if (ops.empty()) return ncclSuccess;
  Registry& r = registry();
  const ncclComm_t comm = ops.front().comm;
  std::vector<std::pair<cudaStream_t, std::shared_ptr<GroupTask>>> tasks;
  {
    const std::lock_guard lock(r.mu);
    const Found f = find(r, comm);
    if (!f.member)
      return refuse(r, nullptr, ncclInvalidArgument,
                    "ncclGroupEnd: the communicator was destroyed before its group was issued");
    for (const Op& op : ops)
      if (op.comm != comm)
        return refuse(r, f.member, ncclInvalidUsage,
                      "ncclGroupEnd: the emulated NCCL takes one communicator per group");
    if (const auto [code, why] = unusable(*f.clique, *f.member, f.rank); code != ncclSuccess)
      return refuse(r, f.member, code, why);
    for (Op& op : ops) {
      const auto peer = static_cast<std::size_t>(op.transfer.peer);
      op.transfer.seq = op.send ? f.member->sends_issued[peer]++ : f.member->recvs_issued[peer]++;
      auto on_stream = [&](const auto& task) { return task.first == op.stream; };
      auto it = std::find_if(tasks.begin(), tasks.end(), on_stream);
      if (it == tasks.end()) {
        tasks.emplace_back(op.stream,
                           std::make_shared<GroupTask>(r.handles.at(comm)->clique, f.rank));
        it = tasks.end() - 1;
        ++f.member->queued;
      }
      (op.send ? it->second->sends : it->second->recvs).push_back(op.transfer);
    }
  }
  ncclResult_t result = ncclSuccess;
  for (const auto& [stream, task] : tasks) {
    const cudaError_t rc = runtime::enqueue(stream, [t = task] { t->run(); });
    if (rc == cudaSuccess) continue;
    const std::string detail = runtime::last_failure_detail();
    const std::lock_guard lock(r.mu);
    if (const Found f = find(r, comm); f.member)
      fail(r, *f.member, ncclUnhandledCudaError,
           rank_name(f.rank) + ": could not enqueue the group on its stream: " +
               cudaGetErrorName(rc) + (detail.empty() ? "" : ": " + detail));
    result = ncclUnhandledCudaError;
  }
  return result;  // tasks that were not enqueued are dropped here, outside the lock
}

// Checks an ncclSend or ncclRecv before it joins a group.
ncclResult_t check(const char* call, const void* buffer, ncclDataType_t type, const Op& op) {
  Registry& r = registry();
  int device = -1;
  {
    const std::lock_guard lock(r.mu);
    const Found f = find(r, op.comm);
    if (!f.member)
      return refuse(r, nullptr, ncclInvalidArgument,
                    std::string(call) + ": comm is not a live communicator");
    device = f.member->device;  // fixed once the rank joined
  }
  // The runtime is asked outside the lock (see Registry).
  const std::size_t bytes = op.transfer.bytes;
  const int stream_device = runtime::stream_device(op.stream);
  const bool on_device = bytes == 0 || runtime::is_device_memory(buffer, bytes, device);
  const bool on_other_device = !on_device && runtime::is_device_memory(buffer, bytes, -1);

  const std::lock_guard lock(r.mu);
  const Found f = find(r, op.comm);
  if (!f.member)
    return refuse(r, nullptr, ncclInvalidArgument, std::string(call) + ": comm was destroyed");
  const std::string who = rank_name(f.rank) + ": " + call + ": ";
  auto invalid = [&](const std::string& why) {
    return refuse(r, f.member, ncclInvalidArgument, who + why);
  };
  if (const auto [code, why] = unusable(*f.clique, *f.member, f.rank); code != ncclSuccess)
    return refuse(r, f.member, code, why);
  if (size_of(type) == 0) return invalid("unknown datatype " + std::to_string(type));
  if (op.transfer.peer < 0 || op.transfer.peer >= f.clique->nranks)
    return invalid(peer_name(op.transfer.peer) + " is not a rank of this " +
                   std::to_string(f.clique->nranks) + "-rank communicator");
  if (stream_device < 0) return invalid("the stream is not a live stream");
  if (stream_device != device)
    return invalid("the stream belongs to device " + std::to_string(stream_device) +
                   " but the communicator's rank is on device " + std::to_string(device));
  if (!on_device)
    return invalid("the buffer (" + std::to_string(bytes) + " bytes) is " +
                   (on_other_device ? "memory of another device"
                                    : "not device memory (a host pointer, freed, or shorter "
                                      "than the transfer)") +
                   "; the communicator's rank is on device " + std::to_string(device));
  return ncclSuccess;
}

// ncclSend and ncclRecv: adds the transfer to this thread's open group, or issues it as a
// group of its own.
ncclResult_t point_to_point(const char* call, const void* buffer, Op op, ncclDataType_t type) {
  const ncclResult_t rc = check(call, buffer, type, op);
  if (t_group.depth == 0) return rc == ncclSuccess ? issue({op}) : rc;
  if (rc == ncclSuccess)
    t_group.ops.push_back(op);
  else if (t_group.error == ncclSuccess)
    t_group.error = rc;
  return rc;
}

ncclResult_t refuse_call(ncclResult_t code, const std::string& what) {
  Registry& r = registry();
  const std::lock_guard lock(r.mu);
  return refuse(r, nullptr, code, what);
}

// The id's bytes name the clique; ids from ncclGetUniqueId differ by a counter.
std::string key_of(const ncclUniqueId& id) { return {id.internal, sizeof id.internal}; }

}  // namespace
}  // namespace ringattn::emu::nccl

using namespace ringattn::emu::nccl;  // this file implements nccl.h's global functions

ncclResult_t ncclGetVersion(int* version) {
  if (!version) return refuse_call(ncclInvalidArgument, "ncclGetVersion: version is NULL");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* unique_id) {
  if (!unique_id) return refuse_call(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
  Registry& r = registry();
  const std::lock_guard lock(r.mu);
  const std::string name = "ringattn-emu-nccl-" + std::to_string(++r.ids_issued);
  std::memset(unique_id->internal, 0, sizeof unique_id->internal);
  std::memcpy(unique_id->internal, name.data(), name.size());
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (ncclGetLastError has the details)";
    case ncclSystemError:
      return "unhandled system error (ncclGetLastError has the details)";
    case ncclInternalError:
      return "internal error (a bug in the emulated NCCL)";
    case ncclInvalidArgument:
      return "invalid argument (ncclGetLastError has the details)";
    case ncclInvalidUsage:
      return "invalid usage (ncclGetLastError has the details)";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
  }
  return "unknown result code";
}

const char* ncclGetLastError(ncclComm_t comm) {
  thread_local std::string copy;  // the caller's view, stable while the state changes
  Registry& r = registry();
  const std::lock_guard lock(r.mu);
  const Found f = find(r, comm);
  copy = f.member ? f.member->last_error : r.last_error;
  return copy.c_str();
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId comm_id, int rank,
                                    ncclConfig_t* config) {
  const std::string call = "ncclCommInitRankConfig: ";
  if (!comm) return refuse_call(ncclInvalidArgument, call + "comm is NULL");
  *comm = nullptr;
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return refuse_call(ncclInvalidArgument,
                       call + "rank " + std::to_string(rank) +
                           " is not in [0, nranks = " + std::to_string(nranks) + ")");
  bool blocking = true;
  if (config) {
    if (config->size != sizeof(ncclConfig_t) || config->magic != 0xcafebeefu)
      return refuse_call(ncclInvalidArgument,
                         call + "config was not initialised with NCCL_CONFIG_INITIALIZER");
    if (config->blocking != NCCL_CONFIG_UNDEF_INT) blocking = config->blocking != 0;
  }
  const int device = ringattn::emu::runtime::current_device();

  Registry& r = registry();
  std::unique_lock lock(r.mu);
  const std::string key = key_of(comm_id);
  if (r.spent.count(key) != 0)
    return refuse(r, nullptr, ncclInvalidUsage,
                  call + "rank " + std::to_string(rank) +
                      ": this unique id already made a communicator (ids are single-use; call "
                      "ncclGetUniqueId for each new one)");
  std::shared_ptr<Clique>& forming = r.forming[key];
  if (!forming) forming = std::make_shared<Clique>(nranks);
  const std::shared_ptr<Clique> clique = forming;
  Clique& c = *clique;
  // Refusals a real initialisation finds when the ranks exchange what they are.
  if (c.nranks != nranks) {
    const std::string why = call + "rank " + std::to_string(rank) +
                            " was given nranks = " + std::to_string(nranks) +
                            " but the communicator was started with " + std::to_string(c.nranks);
    refuse_clique(r, c, ncclInvalidUsage, why);
    return ncclInvalidUsage;
  }
  Member& m = c.members[static_cast<std::size_t>(rank)];
  if (m.joined) {
    refuse_clique(r, c, ncclInvalidUsage, call + "rank " + std::to_string(rank) + " joined twice");
    return ncclInvalidUsage;
  }
  m.joined = true;
  m.device = device;
  m.blocking = blocking;
  m.sends_issued.assign(static_cast<std::size_t>(nranks), 0);
  m.recvs_issued.assign(static_cast<std::size_t>(nranks), 0);
  ++c.joined;
  if (c.refused != ncclSuccess) {
    m.error = c.refused;
    m.last_error = r.last_error;
  }
  for (int other = 0; other < nranks && c.refused == ncclSuccess; ++other) {
    const Member& o = c.members[static_cast<std::size_t>(other)];
    if (other != rank && o.joined && o.device == device)
      refuse_clique(r, c, ncclInvalidUsage,
                    call + "ranks " + std::to_string(std::min(rank, other)) + " and " +
                        std::to_string(std::max(rank, other)) + " both on device " +
                        std::to_string(device) +
                        " (NCCL refuses two ranks of one communicator on one device)");
  }
  if (c.complete()) {
    r.forming.erase(key);
    r.spent.insert(key);
    r.cv.notify_all();
  }
  auto handle = std::make_unique<ncclComm>(ncclComm{clique, rank});
  ncclComm* const h = handle.get();
  r.handles.emplace(h, std::move(handle));
  if (!blocking) {
    *comm = h;
    return ncclInProgress;  // ncclCommGetAsyncError reports how it ends
  }
  r.cv.wait(lock, [&] { return c.complete() || c.refused != ncclSuccess; });
  if (c.complete()) {
    *comm = h;
    return ncclSuccess;
  }
  const ncclResult_t rc = c.refused;
  r.handles.erase(h);  // a failed blocking initialisation leaves no communicator
  return rc;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
  Registry& r = registry();
  const std::lock_guard lock(r.mu);
  const Found f = find(r, comm);
  if (!f.member || !async_error)
    return refuse(r, f.member, ncclInvalidArgument,
                  "ncclCommGetAsyncError: comm is not a live communicator or asyncError is NULL");
  if (f.member->error != ncclSuccess)
    *async_error = f.member->error;
  else if (!f.clique->complete() || (f.member->finalizing && f.member->queued > 0))
    *async_error = ncclInProgress;
  else
    *async_error = ncclSuccess;
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  Registry& r = registry();
  std::unique_lock lock(r.mu);
  const Found f = find(r, comm);
  if (!f.member)
    return refuse(r, nullptr, ncclInvalidArgument,
                  "ncclCommFinalize: comm is not a live communicator");
  Member& m = *f.member;
  if (m.aborted || !f.clique->complete())
    return refuse(r, &m, ncclInvalidUsage,
                  rank_name(f.rank) +
                      ": ncclCommFinalize: the communicator was aborted or "
                      "never finished initialising");
  m.finalizing = true;
  if (!m.blocking) return m.queued > 0 ? ncclInProgress : m.error;
  r.cv.wait(lock, [&] { return m.queued == 0 || m.aborted; });
  return m.error;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  Registry& r = registry();
  std::unique_lock lock(r.mu);
  const Found f = find(r, comm);
  if (!f.member)
    return refuse(r, nullptr, ncclInvalidArgument,
                  "ncclCommDestroy: comm is not a live communicator");
  Member& m = *f.member;
  // As NCCL's, destroying waits for the communicator's work (ncclCommAbort does not).
  r.cv.wait(lock, [&] { return m.queued == 0 || m.aborted; });
  if (m.gone.empty()) m.gone = "destroyed its communicator";
  if (f.clique->joined < f.clique->nranks && f.clique->refused == ncclSuccess)
    refuse_clique(r, *f.clique, ncclRemoteError,
                  rank_name(f.rank) + " destroyed its communicator before every rank joined");
  r.cv.notify_all();
  r.handles.erase(comm);
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  Registry& r = registry();
  std::unique_lock lock(r.mu);
  const Found f = find(r, comm);
  if (!f.member)
    return refuse(r, nullptr, ncclInvalidArgument,
                  "ncclCommAbort: comm is not a live communicator");
  Member& m = *f.member;
  if (m.aborted) return ncclSuccess;
  m.aborted = true;
  if (m.error == ncclSuccess) m.error = ncclSystemError;
  if (m.last_error.empty())
    m.last_error = rank_name(f.rank) + ": communicator aborted (ncclCommAbort)";
  if (m.gone.empty()) m.gone = "aborted its communicator";
  if (f.clique->joined < f.clique->nranks && f.clique->refused == ncclSuccess)
    refuse_clique(r, *f.clique, ncclRemoteError,
                  rank_name(f.rank) + " aborted its communicator before every rank joined");
  r.cv.notify_all();
  // The running tasks wake, write why they stopped and end: once this returns, no transfer
  // of the communicator touches a buffer (queued tasks end without touching theirs).
  r.cv.wait(lock, [&] { return m.running == 0; });
  return ncclSuccess;
}

ncclResult_t ncclGroupStart() {
  ++t_group.depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (t_group.depth == 0)
    return refuse_call(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--t_group.depth > 0) return ncclSuccess;
  std::vector<Op> ops = std::move(t_group.ops);
  const ncclResult_t error = t_group.error;
  t_group = {};
  return error != ncclSuccess ? error : issue(std::move(ops));
}

ncclResult_t ncclSend(const void* sendbuff, std::size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  const Op op{comm, stream, true, {peer, count * size_of(datatype), sendbuff, nullptr}};
  return point_to_point("ncclSend", sendbuff, op, datatype);
}

ncclResult_t ncclRecv(void* recvbuff, std::size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  const Op op{comm, stream, false, {peer, count * size_of(datatype), nullptr, recvbuff}};
  return point_to_point("ncclRecv", recvbuff, op, datatype);
}
