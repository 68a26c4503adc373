#include "services/stager/peer_service.h"

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"

namespace tutti::stager {

grpc::ServerUnaryReactor* PeerStagerService::Refuse(grpc::CallbackServerContext* ctx,
                                                    const char* method) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(gate_->Refuse(
      "peer_listener",
      absl::PermissionDeniedError(absl::StrCat(
          method,
          " on the stager's --peer_listen address: it serves only other nodes' stagers "
          "(FetchMembers); a rank connects to the stager of its node at its --listen address "
          "(TUTTI_STAGER)")))));
  return reactor;
}

}  // namespace tutti::stager
