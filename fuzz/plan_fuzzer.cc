// The plan decoders over an arbitrary StepPlan: the stager's batch layout
// (every sample named, sizes aligned, arrays laid out, written and
// compacted) and the client's exchange layout for every rank plan in it, of
// every item and of each encoder's.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "client/exchange_layout.h"
#include "common/job_config.h"
#include "fuzz/fuzz_job.h"
#include "google/protobuf/stubs/logging.h"
#include "services/stager/decode/batch_layout.h"
#include "tutti/v1/plan.pb.h"

namespace {

// Layouts larger than this are checked but not written (the stager's memory
// budget refuses them before allocating).
constexpr uint64_t kMaxWrittenBytes = 64 << 20;

const tutti::v1::JobConfig& Config() {
  static const tutti::v1::JobConfig* config = [] {
    auto c = tutti::ParseJobConfig(tutti::fuzz::kFuzzJobConfig, "fuzz_job.h");
    if (!c.ok()) std::abort();
    auto* out = new tutti::v1::JobConfig(*c);
    tutti::ApplyJobDefaults(out);
    return out;
  }();
  return *config;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Invalid UTF-8 in string fields is logged by protobuf for every input.
  static const bool quiet = [] {
    google::protobuf::SetLogHandler(nullptr);
    return true;
  }();
  (void)quiet;
  tutti::v1::StepPlan plan;
  if (!plan.ParseFromArray(data, static_cast<int>(size))) return 0;
  const auto params = tutti::stager::PatchifyParams::FromConfig(Config().vision());
  for (const tutti::v1::RankPlan& rank : plan.ranks()) {
    auto layout = tutti::stager::BatchLayout::Build(plan, rank, Config(), params);
    if (layout.ok() && layout->total_bytes() <= kMaxWrittenBytes) {
      std::vector<char> segment(layout->total_bytes());
      layout->WriteFixed(segment.data());
      for (size_t d = 0; d < layout->docs().size(); ++d) {
        layout->WriteText(segment.data(), d, {1, 2, 3});
      }
      std::vector<bool> images(layout->images().size()), docs(layout->docs().size()),
          audio(layout->audio().size());
      for (size_t i = 0; i < images.size(); i += 2) images[i] = true;
      for (size_t i = 1; i < docs.size(); i += 2) docs[i] = true;
      for (size_t i = 0; i < audio.size(); i += 2) audio[i] = true;
      (void)layout->Finalize(segment.data(), images, docs, audio);
    }
    const uint32_t world = std::max<uint32_t>(1, plan.world_size() % 4096);
    for (auto dir : {tutti::ExchangeDirection::kForward, tutti::ExchangeDirection::kBackward,
                     tutti::ExchangeDirection::kLoad}) {
      // Every item, then each encoder's alone (its output order checked).
      for (auto encoder :
           {tutti::v1::ENCODER_UNSPECIFIED, tutti::v1::ENCODER_VISION, tutti::v1::ENCODER_AUDIO}) {
        tutti::ExchangeContext ctx{plan.step(), plan.world_size()};
        ctx.encoder = encoder;
        (void)tutti::BuildExchangeLayout(rank, dir, rank.rank(), world, ctx);
      }
    }
  }
  return 0;
}
