// NCCL as the emulator provides it (builds with -DRINGATTN_CUDA_EMULATION=ON put this
// directory before any toolkit): point-to-point send/receive between ranks that are host
// threads of one process, each bound to its own emulated device, with NCCL's names, numeric
// codes and nonblocking semantics; implemented in src/emu/nccl.cpp. Like the runtime shim,
// only what ringattn calls is here, so a new call fails to compile instead of misbehaving.
#pragma once

#include <cuda_runtime_api.h>

#include <climits>
#include <cstddef>

#define NCCL_MAJOR 2
#define NCCL_MINOR 28
#define NCCL_PATCH 9
// Versions after 2.8 are coded major*10000 + minor*100 + patch, earlier ones major*1000 + ...
#define NCCL_VERSION(X, Y, Z) \
  (((X) <= 2 && (Y) <= 8) ? (X)*1000 + (Y)*100 + (Z) : (X)*10000 + (Y)*100 + (Z))
#define NCCL_VERSION_CODE NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH)

enum ncclResult_t {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
};

enum ncclDataType_t {
  ncclInt8 = 0,
  ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclHalf = 6,
  ncclFloat32 = 7,
  ncclFloat = 7,
  ncclFloat64 = 8,
  ncclDouble = 8,
  ncclBfloat16 = 9,
};

struct ncclComm;
using ncclComm_t = ncclComm*;

#define NCCL_UNIQUE_ID_BYTES 128
struct ncclUniqueId {
  char internal[NCCL_UNIQUE_ID_BYTES];
};

#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR nullptr

// size, magic and version let ncclCommInitRankConfig refuse a config that was not started
// from NCCL_CONFIG_INITIALIZER. Only `blocking` changes what the emulator does; the other
// tuning fields are accepted so that code setting them compiles, and are ignored (there are
// no CTAs or networks here).
struct ncclConfig_t {
  std::size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;  // 0: calls return ncclInProgress and finish in the background
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char* netName;
  int splitShare;
};

#define NCCL_CONFIG_INITIALIZER                                                          \
  {                                                                                      \
    sizeof(ncclConfig_t), 0xcafebeefu, NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,             \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT              \
  }

ncclResult_t ncclGetVersion(int* version);
ncclResult_t ncclGetUniqueId(ncclUniqueId* unique_id);
const char* ncclGetErrorString(ncclResult_t result);
// The most recent error of `comm` (nullptr: of the whole process), in words; "" if none.
// The string stays valid until this thread calls ncclGetLastError again.
const char* ncclGetLastError(ncclComm_t comm);

// Binds the new rank to this thread's current device. Nonblocking (config->blocking == 0):
// returns ncclInProgress, and ncclCommGetAsyncError reports ncclInProgress until every
// rank of `comm_id` has joined.
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId comm_id, int rank,
                                    ncclConfig_t* config);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error);
// Flushes the communicator's queued work (nonblocking: ncclInProgress until it is done).
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
// Ends the communicator's transfers, waking any stream task waiting on a peer. Unlike
// NCCL's, the handle stays valid (its calls report the abort) until ncclCommDestroy, so a
// watchdog may abort while another thread still polls it; aborting again does nothing.
ncclResult_t ncclCommAbort(ncclComm_t comm);

ncclResult_t ncclGroupStart();
ncclResult_t ncclGroupEnd();

ncclResult_t ncclSend(const void* sendbuff, std::size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclRecv(void* recvbuff, std::size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
