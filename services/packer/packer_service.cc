#include "services/packer/packer_service.h"

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
class PlanStream final : public grpc::ServerWriteReactor<v1::StepPlan> {
 public:
  PlanStream(Packer* packer, ClientView client, uint64_t start, uint64_t end)
      : packer_(packer), client_(std::move(client)), next_(start), end_(end) {
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
    packer_->GetPlan(next_, client_, &plan_, [this](absl::Status s) {
      packer_->CountServed(true, s);
      if (!s.ok()) {
        Finish(ToGrpcStatus(s));
        return;
      }
      StartWrite(&plan_);
    });
  }

  Packer* packer_;
  const ClientView client_;
  uint64_t next_;
  const uint64_t end_;
  v1::StepPlan plan_;
};

}  // namespace

grpc::ServerUnaryReactor* PackerService::GetJob(grpc::CallbackServerContext* ctx,
                                                const v1::GetJobRequest*, v1::JobInfo* resp) {
  *resp = packer_->job_info();
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* PackerService::GetPlan(grpc::CallbackServerContext* ctx,
                                                 const v1::GetPlanRequest* req,
                                                 v1::StepPlan* resp) {
  auto* reactor = ctx->DefaultReactor();
  packer_->GetPlan(req->step(), ViewOf(*req), resp, [this, reactor](absl::Status s) {
    packer_->CountServed(false, s);
    reactor->Finish(ToGrpcStatus(s));
  });
  return reactor;
}

grpc::ServerWriteReactor<v1::StepPlan>* PackerService::StreamPlans(
    grpc::CallbackServerContext* ctx, const v1::StreamPlansRequest* req) {
  ClientView client = ViewOf(*req);
  absl::Status s = packer_->CheckClient(client);
  absl::StatusOr<uint64_t> end =
      s.ok() ? packer_->StreamEnd(req->start_step(), req->end_step()) : absl::StatusOr<uint64_t>(s);
  if (!end.ok()) {
    packer_->CountServed(true, end.status());
    class Refused final : public grpc::ServerWriteReactor<v1::StepPlan> {
     public:
      explicit Refused(const absl::Status& s) { Finish(ToGrpcStatus(s)); }
      void OnDone() override { delete this; }
    };
    return new Refused(end.status());
  }
  return new PlanStream(packer_, std::move(client), req->start_step(), *end);
}

grpc::ServerUnaryReactor* PackerService::ReportTiming(grpc::CallbackServerContext* ctx,
                                                      const v1::StepTimingReport* req,
                                                      v1::ReportTimingResponse*) {
  StepTiming t;
  t.step = req->step();
  t.rank = req->rank();
  for (const auto& p : req->phases()) t.phases.emplace_back(p.phase(), p.seconds());
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(packer_->ReportTiming(t)));
  return reactor;
}

}  // namespace tutti::packer
