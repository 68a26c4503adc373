// The plan's all-to-all on GPUs: grouped ncclSend/ncclRecv on a CUDA stream,
// one send and one receive per peer with bytes (a plan_version 4 pair is one
// contiguous run at both ends), buffers in device memory. Built only when CMake finds CUDA and NCCL
// (TUTTI_HAVE_NCCL).
//
// NCCL has no way to abandon a mismatched exchange, so the agreement before
// data moves runs on a host transport over the same ranks (normally an
// MpiTransport): give one as `control`. Without it only this rank's own
// checks run, and ranks whose plans disagree hang in NCCL.
#ifndef TUTTI_CLIENT_NCCL_TRANSPORT_H_
#define TUTTI_CLIENT_NCCL_TRANSPORT_H_

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "client/transport.h"

namespace tutti {

struct NcclTransportOptions {
  // Wait for the stream after enqueuing an exchange, so the receive buffer is
  // ready when Exchange() returns. Default false: the exchange is ordered on
  // the stream like any kernel and the caller synchronises as it needs.
  bool synchronize = false;
};

// An NCCL or CUDA result as a Status naming what failed (and NCCL's last
// error text for the communicator when there is one).
absl::Status NcclStatus(ncclResult_t result, ncclComm_t comm, absl::string_view what);
absl::Status CudaStatus(cudaError_t err, absl::string_view what);

class NcclTransport final : public Transport {
 public:
  // Wraps an initialised communicator (not owned). `control` (not owned, may
  // be null) must have the same rank and size.
  static absl::StatusOr<std::unique_ptr<NcclTransport>> Create(
      ncclComm_t comm, cudaStream_t stream, Transport* control,
      const NcclTransportOptions& opts = {});
  // Creates (and owns) a communicator over the ranks of `mpi_comm` on CUDA
  // device `device`: rank 0's ncclUniqueId is broadcast over MPI. Collective
  // over mpi_comm.
  static absl::StatusOr<std::unique_ptr<NcclTransport>> CreateWithMpi(
      MPI_Comm mpi_comm, int device, cudaStream_t stream, Transport* control,
      const NcclTransportOptions& opts = {});

  ~NcclTransport() override;
  NcclTransport(const NcclTransport&) = delete;
  NcclTransport& operator=(const NcclTransport&) = delete;

  uint32_t rank() const override { return rank_; }
  uint32_t world_size() const override { return size_; }
  absl::string_view name() const override { return "nccl"; }
  ncclComm_t comm() const { return comm_; }
  // ncclSend calls of the latest exchange per peer (world_size entries): one
  // per peer with bytes (the rank's own part is one too: NCCL moves it).
  const std::vector<uint64_t>& messages_sent_to() const { return messages_to_; }

  absl::Status Agree(const ExchangeLayout& layout, const absl::Status& local) override;

 protected:
  absl::Status Move(const ExchangeLayout& layout, const void* send, void* recv) override;

 private:
  NcclTransport(ncclComm_t comm, bool owned, cudaStream_t stream, Transport* control, uint32_t rank,
                uint32_t size, const NcclTransportOptions& opts)
      : comm_(comm),
        owned_(owned),
        stream_(stream),
        control_(control),
        rank_(rank),
        size_(size),
        opts_(opts) {}

  ncclComm_t comm_;
  bool owned_;
  cudaStream_t stream_;
  Transport* control_;
  uint32_t rank_;
  uint32_t size_;
  NcclTransportOptions opts_;
  std::vector<uint64_t> messages_to_;
};

}  // namespace tutti

#endif  // TUTTI_CLIENT_NCCL_TRANSPORT_H_
