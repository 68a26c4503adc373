#include "client/nccl_transport.h"

#include "absl/strings/str_cat.h"
#include "client/mpi_transport.h"
#include "common/status.h"
#include "tutti/v1/plan.pb.h"

namespace tutti {

absl::Status NcclStatus(ncclResult_t result, ncclComm_t comm, absl::string_view what) {
  if (result == ncclSuccess) return absl::OkStatus();
  const char* last = comm != nullptr ? ncclGetLastError(comm) : nullptr;
  std::string msg = absl::StrCat(what, ": NCCL error ", static_cast<int>(result), " (",
                                 ncclGetErrorString(result), ")");
  if (last != nullptr && *last != '\0') absl::StrAppend(&msg, ": ", last);
  switch (result) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return absl::InvalidArgumentError(msg);
    case ncclRemoteError:
    case ncclSystemError:
      return absl::UnavailableError(msg);
    default:
      return absl::InternalError(msg);
  }
}

absl::Status CudaStatus(cudaError_t err, absl::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": CUDA error ", static_cast<int>(err), " (",
                                          cudaGetErrorName(err), "): ", cudaGetErrorString(err)));
}

absl::StatusOr<std::unique_ptr<NcclTransport>> NcclTransport::Create(
    ncclComm_t comm, cudaStream_t stream, Transport* control, const NcclTransportOptions& opts) {
  int rank = 0, size = 0;
  RETURN_IF_ERROR(NcclStatus(ncclCommUserRank(comm, &rank), comm, "ncclCommUserRank"));
  RETURN_IF_ERROR(NcclStatus(ncclCommCount(comm, &size), comm, "ncclCommCount"));
  if (control != nullptr && (control->rank() != static_cast<uint32_t>(rank) ||
                             control->world_size() != static_cast<uint32_t>(size))) {
    return absl::FailedPreconditionError(
        absl::StrCat("the control transport is rank ", control->rank(), " of ",
                     control->world_size(), " but the NCCL communicator is rank ", rank, " of ",
                     size, "; build both over the same ranks in the same order"));
  }
  return std::unique_ptr<NcclTransport>(new NcclTransport(comm, false, stream, control,
                                                          static_cast<uint32_t>(rank),
                                                          static_cast<uint32_t>(size), opts));
}

absl::StatusOr<std::unique_ptr<NcclTransport>> NcclTransport::CreateWithMpi(
    MPI_Comm mpi_comm, int device, cudaStream_t stream, Transport* control,
    const NcclTransportOptions& opts) {
  int rank = 0, size = 0;
  MPI_Comm_rank(mpi_comm, &rank);
  MPI_Comm_size(mpi_comm, &size);
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device), absl::StrCat("cudaSetDevice(", device, ")")));
  ncclUniqueId id;
  if (rank == 0) RETURN_IF_ERROR(NcclStatus(ncclGetUniqueId(&id), nullptr, "ncclGetUniqueId"));
  RETURN_IF_ERROR(
      MpiStatus(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, mpi_comm), "MPI_Bcast of the NCCL id"));
  ncclComm_t comm = nullptr;
  RETURN_IF_ERROR(NcclStatus(ncclCommInitRank(&comm, size, id, rank), nullptr,
                             absl::StrCat("ncclCommInitRank(rank ", rank, " of ", size, ")")));
  auto t = Create(comm, stream, control, opts);
  if (!t.ok()) {
    ncclCommDestroy(comm);
    return t.status();
  }
  (*t)->owned_ = true;
  return t;
}

NcclTransport::~NcclTransport() {
  if (owned_ && comm_ != nullptr) ncclCommDestroy(comm_);
}

absl::Status NcclTransport::Agree(const ExchangeLayout& layout, const absl::Status& local) {
  return control_ != nullptr ? control_->Agree(layout, local) : local;
}

absl::Status NcclTransport::Move(const ExchangeLayout& layout, const void* send, void* recv) {
  const std::string where = ExchangeWhere(layout.step, rank_);
  const auto* in = static_cast<const char*>(send);
  auto* out = static_cast<char*>(recv);
  messages_to_.assign(size_, 0);
  RETURN_IF_ERROR(NcclStatus(ncclGroupStart(), comm_, where + ": ncclGroupStart"));
  absl::Status status;
  for (uint32_t p = 0; p < size_ && status.ok(); ++p) {
    if (layout.send_counts[p] > 0) {
      status = NcclStatus(ncclSend(in + layout.send_offsets[p], layout.send_counts[p], ncclUint8,
                                   static_cast<int>(p), comm_, stream_),
                          comm_, absl::StrCat(where, ": ncclSend to rank ", p));
      ++messages_to_[p];
    }
    if (status.ok() && layout.recv_counts[p] > 0) {
      status = NcclStatus(ncclRecv(out + layout.recv_offsets[p], layout.recv_counts[p], ncclUint8,
                                   static_cast<int>(p), comm_, stream_),
                          comm_, absl::StrCat(where, ": ncclRecv from rank ", p));
    }
  }
  // The group must be closed even after a failed call inside it.
  absl::Status end = NcclStatus(ncclGroupEnd(), comm_, where + ": ncclGroupEnd");
  RETURN_IF_ERROR(status);
  RETURN_IF_ERROR(end);
  if (opts_.synchronize) {
    RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream_), where + ": cudaStreamSynchronize"));
  }
  return absl::OkStatus();
}

}  // namespace tutti
