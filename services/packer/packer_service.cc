#include "services/packer/packer_service.h"

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"

namespace tutti::packer {
namespace {

template <typename Request>
ClientView ViewOf(const Request& req) {
  ClientView c;
  c.world_size = req.world_size();
  c.config_fingerprint = req.config_fingerprint();
  c.ranks.assign(req.ranks().begin(), req.ranks().end());
  return c;
}

// Streams the plans of [start, end) one write at a time; the next plan is
// fetched when the previous write is done. gRPC completes a write once it
// is buffered (flow control), not when the client has read it, so only a
// bounded range (end_step) keeps the plan window near the client: an
// open-ended stream runs as far ahead as the buffers allow.
class PlanStream final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  PlanStream(Packer* packer, ClientView client, uint64_t start, uint64_t end, CallTicket ticket)
      : packer_(packer),
        client_(std::move(client)),
        next_(start),
        end_(end),
        ticket_(std::move(ticket)) {
    Next();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the client stopped reading"));
      return;
    }
    ++next_;
    Next();
  }
  void OnDone() override { delete this; }

 private:
  void Next() {
    if (next_ >= end_) {
      Finish(grpc::Status::OK);
      return;
    }
    packer_->GetPlanBytes(next_, client_, [this](absl::StatusOr<Packer::PlanBytes> bytes) {
      packer_->CountServed(true, bytes.status());
      if (!bytes.ok()) {
        Finish(ToGrpcStatus(bytes.status()));
        return;
      }
      // Swapped in: assigning would copy the buffer (another allocation).
      grpc::ByteBuffer answer = AsByteBuffer(*std::move(bytes));
      bytes_.Swap(&answer);
      StartWrite(&bytes_);
    });
  }

  Packer* packer_;
  const ClientView client_;
  uint64_t next_;
  const uint64_t end_;
  const CallTicket ticket_;
  grpc::ByteBuffer bytes_;
};

}  // namespace

grpc::ByteBuffer AsByteBuffer(Packer::PlanBytes bytes) {
  auto* held = new Packer::PlanBytes(std::move(bytes));
  grpc::Slice slice(
      const_cast<char*>((*held)->data()), (*held)->size(),
      [](void* p) { delete static_cast<Packer::PlanBytes*>(p); }, held);
  return grpc::ByteBuffer(&slice, 1);
}

absl::Status PackerService::CheckRankList(int ranks) {
  const uint32_t world = packer_->job().world_size();
  if (static_cast<uint32_t>(ranks) <= world) return absl::OkStatus();
  return gate_->Refuse("too_many_items",
                       absl::InvalidArgumentError(
                           absl::StrCat("the request names ", ranks, " ranks but the job has ",
                                        world, "; name each rank at most once (none: all ranks)")));
}

grpc::ServerUnaryReactor* PackerService::GetJob(grpc::CallbackServerContext* ctx,
                                                const grpc::ByteBuffer* in, grpc::ByteBuffer* out) {
  return ServeUnary<v1::GetJobRequest, v1::JobInfo>(
      gate_, ctx, in, out, [this](const v1::GetJobRequest&, v1::JobInfo* resp, auto done) {
        *resp = packer_->job_info();
        done(absl::OkStatus());
      });
}

grpc::ServerUnaryReactor* PackerService::GetPlan(grpc::CallbackServerContext* ctx,
                                                 const grpc::ByteBuffer* in,
                                                 grpc::ByteBuffer* out) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  v1::GetPlanRequest req;
  absl::StatusOr<CallTicket> ticket = gate_->Admit(*ctx, *in, &req);
  if (!ticket.ok()) {
    reactor->Finish(ToGrpcStatus(ticket.status()));
    return reactor;
  }
  if (absl::Status s = CheckRankList(req.ranks_size()); !s.ok()) {
    reactor->Finish(ToGrpcStatus(s));
    return reactor;
  }
  packer_->GetPlanBytes(
      req.step(), ViewOf(req),
      [this, reactor, out, ticket = *std::move(ticket)](absl::StatusOr<Packer::PlanBytes> bytes) {
        packer_->CountServed(false, bytes.status());
        if (bytes.ok()) {
          grpc::ByteBuffer answer = AsByteBuffer(*std::move(bytes));
          out->Swap(&answer);
        }
        reactor->Finish(ToGrpcStatus(bytes.status()));
      });
  return reactor;
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* PackerService::StreamPlans(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in) {
  v1::StreamPlansRequest req;
  absl::StatusOr<CallTicket> ticket = gate_->Admit(*ctx, *in, &req);
  if (!ticket.ok()) return new RefusedStream(ticket.status());
  absl::StatusOr<CallTicket> stream = AdmitStream(ctx->peer());
  if (!stream.ok()) return new RefusedStream(stream.status());
  // One ticket holding both: the call in flight and the client's stream.
  ticket = CallTicket(std::make_shared<std::pair<CallTicket, CallTicket>>(*std::move(ticket),
                                                                          *std::move(stream)));
  ClientView client = ViewOf(req);
  absl::Status s = CheckRankList(req.ranks_size());
  if (s.ok()) s = packer_->CheckClient(client);
  absl::StatusOr<uint64_t> end =
      s.ok() ? packer_->StreamEnd(req.start_step(), req.end_step()) : absl::StatusOr<uint64_t>(s);
  if (!end.ok()) {
    packer_->CountServed(true, end.status());
    return new RefusedStream(end.status());
  }
  return new PlanStream(packer_, std::move(client), req.start_step(), *end, *std::move(ticket));
}

absl::StatusOr<CallTicket> PackerService::AdmitStream(const std::string& peer) {
  {
    absl::MutexLock l(&streams_mu_);
    uint32_t& open = streams_[peer];
    if (open < max_streams_per_client_) {
      ++open;
      return CallTicket(nullptr, [this, peer](void*) {
        absl::MutexLock l(&streams_mu_);
        auto it = streams_.find(peer);
        if (it != streams_.end() && --it->second == 0) streams_.erase(it);
      });
    }
  }
  return gate_->Refuse(
      "too_many_streams",
      absl::ResourceExhaustedError(absl::StrCat(
          "client ", peer, " already holds ", max_streams_per_client_,
          " plan streams, the limit (--max_streams_per_client ", max_streams_per_client_,
          "); finish or cancel one first")));
}

grpc::ServerUnaryReactor* PackerService::ReportTiming(grpc::CallbackServerContext* ctx,
                                                      const grpc::ByteBuffer* in,
                                                      grpc::ByteBuffer* out) {
  return ServeUnary<v1::StepTimingReport, v1::ReportTimingResponse>(
      gate_, ctx, in, out,
      [this, ctx](const v1::StepTimingReport& req, v1::ReportTimingResponse*, auto done) {
        if (req.phases_size() > kMaxReportPhases) {
          return done(gate_->Refuse(
              "too_many_items",
              absl::InvalidArgumentError(absl::StrCat("a timing report carries ", req.phases_size(),
                                                      " phases, more than ", kMaxReportPhases))));
        }
        absl::StatusOr<ClientIdentity> caller = CallIdentity(*ctx);
        absl::Status s = caller.ok() ? ranks_->Admit(*caller, req.rank()) : caller.status();
        if (!s.ok()) return done(gate_->Refuse("permission_denied", s));
        StepTiming t;
        t.step = req.step();
        t.rank = req.rank();
        for (const auto& p : req.phases()) t.phases.emplace_back(p.phase(), p.seconds());
        t.config_fingerprint = req.config_fingerprint();
        s = packer_->ReportTiming(t);
        done(absl::IsInvalidArgument(s) ? gate_->Refuse("invalid", s) : s);
      });
}

grpc::ServerUnaryReactor* PackerService::ReportNode(grpc::CallbackServerContext* ctx,
                                                    const grpc::ByteBuffer* in,
                                                    grpc::ByteBuffer* out) {
  return ServeUnary<v1::NodeReport, v1::NodeReportResponse>(
      gate_, ctx, in, out, [this](const v1::NodeReport& req, v1::NodeReportResponse*, auto done) {
        if (monitor_ == nullptr) {
          return done(absl::FailedPreconditionError(
              "tutti-packerd does not act on node reports: the job has no locality, or the "
              "packer runs without --locality_record"));
        }
        absl::Status s = monitor_->Report(req);
        done(absl::IsInvalidArgument(s) ? gate_->Refuse("invalid", s) : s);
      });
}

}  // namespace tutti::packer
