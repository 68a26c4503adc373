#include "common/job_config.h"

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/text_format.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/crc32c.h"
#include "common/file_io.h"
#include "common/job_limits.h"
#include "common/mixture_config.h"
#include "common/model_shape.h"
#include "common/status.h"

namespace tutti {
namespace {

class CollectingErrors final : public google::protobuf::io::ErrorCollector {
 public:
  explicit CollectingErrors(const std::string& text) : lines_(absl::StrSplit(text, '\n')) {}

  void AddError(int line, int column, const std::string& message) override {
    if (!first_.empty()) return;
    first_ = absl::StrCat("line ", line + 1, " column ", column + 1, ": ", Explain(line, message));
  }
  const std::string& first() const { return first_; }

 private:
  // The parser's "Expected integer, got: -" for a negative number in an
  // unsigned field, said as what it is, naming the field.
  std::string Explain(int line, const std::string& message) const {
    if (message.rfind("Expected integer, got: -", 0) != 0) return message;
    std::string field = "the field";
    if (line >= 0 && static_cast<size_t>(line) < lines_.size()) {
      absl::string_view l = lines_[line];
      const size_t colon = l.rfind(':', l.find('-'));
      if (colon != absl::string_view::npos) {
        absl::string_view name = absl::StripAsciiWhitespace(l.substr(0, colon));
        const size_t space = name.find_last_of(" \t{");
        if (space != absl::string_view::npos) name.remove_prefix(space + 1);
        if (!name.empty()) field = absl::StrCat("'", name, "'");
      }
    }
    return absl::StrCat("a negative number for ", field,
                        ", which takes a non-negative integer (a count, size or id)");
  }

  std::vector<std::string> lines_;
  std::string first_;
};

}  // namespace

absl::StatusOr<v1::JobConfig> ParseJobConfig(const std::string& text, const std::string& origin) {
  v1::JobConfig config;
  google::protobuf::TextFormat::Parser parser;
  CollectingErrors errors(text);
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text, &config)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job config ", origin, ": ", errors.first(),
        " (the file is a text-format tutti.v1.JobConfig; see deploy/examples/job.textproto)"));
  }
  return config;
}

const std::vector<std::string>& PackingStrategyNames() {
  static const auto* names = new std::vector<std::string>{
      "greedy", "seed-v1", "seed-v2", "tutti", "lpt", "kk", "multipack", "sequential"};
  return *names;
}

absl::StatusOr<v1::JobConfig> LoadJobConfig(const std::string& path) {
  auto text = ReadFileToString(path);
  if (!text.ok()) return Annotate(text.status(), "cannot read job config");
  return ParseJobConfig(*text, path);
}

void ApplyJobDefaults(v1::JobConfig* c) {
  if (c->job_id().empty()) c->set_job_id("tutti");
  // Only what was not given: an explicit 0 stays, for validation to name.
  if (!c->has_world_size()) c->set_world_size(1);
  if (!c->has_ranks_per_node()) {
    c->set_ranks_per_node(std::max<uint32_t>(1, std::min<uint32_t>(8, c->world_size())));
  }
  if (c->plan_window() == 0) c->set_plan_window(8);
  if (c->skip_policy() == v1::SKIP_POLICY_UNSPECIFIED)
    c->set_skip_policy(v1::SKIP_POLICY_SUBSTITUTE);
  if (c->sample_deadline_ms() == 0) c->set_sample_deadline_ms(2000);

  auto* v = c->mutable_vision();
  if (v->patch_size() == 0) v->set_patch_size(14);
  if (v->merge_size() == 0) v->set_merge_size(2);
  if (v->temporal_patch() == 0) v->set_temporal_patch(2);
  if (v->min_pixels() == 0) v->set_min_pixels(3136);
  if (v->max_pixels() == 0) v->set_max_pixels(1003520);
  if (v->max_aspect_ratio() == 0) v->set_max_aspect_ratio(200);
  if (v->mean_size() == 0) {
    for (float m : {0.48145466f, 0.4578275f, 0.40821073f}) v->add_mean(m);
  }
  if (v->std_size() == 0) {
    for (float s : {0.26862954f, 0.26130258f, 0.27577711f}) v->add_std(s);
  }
  if (v->output_dtype() == v1::DTYPE_UNSPECIFIED) v->set_output_dtype(v1::DTYPE_FLOAT32);
  if (v->max_source_pixels() == 0) v->set_max_source_pixels(178956970);
  if (v->max_source_side() == 0) v->set_max_source_side(65500);
  if (v->vision_start_id() == 0) v->set_vision_start_id(151652);
  if (v->image_pad_id() == 0) v->set_image_pad_id(151655);
  if (v->vision_end_id() == 0) v->set_vision_end_id(151653);

  auto* a = c->mutable_audio();
  if (a->sample_rate() == 0) a->set_sample_rate(16000);
  if (a->frames_per_token() == 0) a->set_frames_per_token(4);
  if (a->max_seconds() == 0) a->set_max_seconds(30);
  if (a->audio_start_id() == 0) a->set_audio_start_id(151647);
  if (a->audio_pad_id() == 0) a->set_audio_pad_id(151646);
  if (a->audio_end_id() == 0) a->set_audio_end_id(151648);

  if (c->curriculum_size() == 0) {
    auto* s = c->add_curriculum();
    s->set_start_step(0);
    s->set_max_pixels(v->max_pixels());
    s->set_seq_len(8192);
  }
  for (auto& s : *c->mutable_curriculum()) {
    if (s.max_pixels() == 0) s.set_max_pixels(v->max_pixels());
    if (s.seq_len() == 0) s.set_seq_len(8192);
  }

  auto* cm = c->mutable_cost();
  // The constants not given: from the named model's shape where it names a
  // known one (validation names an unknown one), else the seed's defaults.
  std::optional<CostModelOptions> shaped;
  if (!cm->model().empty()) {
    if (auto shape = ModelPreset(cm->model()); shape.ok()) shaped = ShapeCostOptions(*shape);
  }
  const CostModelOptions base = shaped.value_or(CostModelOptions());
  if (cm->vit_linear() == 0) cm->set_vit_linear(base.vit_linear);
  if (!shaped) {
    if (cm->p_ref() == 0) cm->set_p_ref(4096);
    if (cm->vit_quadratic() == 0) cm->set_vit_quadratic(1.0 / cm->p_ref());
  } else if (cm->vit_quadratic() == 0) {
    cm->set_vit_quadratic(cm->p_ref() > 0 ? cm->vit_linear() / cm->p_ref() : base.vit_quadratic);
  }
  if (cm->p_ref() == 0) cm->set_p_ref(cm->vit_linear() / cm->vit_quadratic());
  if (cm->llm_linear() == 0) cm->set_llm_linear(base.llm_linear);
  if (cm->llm_quadratic() == 0) cm->set_llm_quadratic(base.llm_quadratic);
  if (cm->audio_linear() == 0) cm->set_audio_linear(base.audio_linear);
  if (cm->audio_quadratic() == 0) cm->set_audio_quadratic(base.audio_quadratic);

  auto* b = c->mutable_batch();
  if (b->grad_accum() == 0) b->set_grad_accum(2);
  if (b->text_micro_batch() == 0) b->set_text_micro_batch(1);
  if (b->vl_micro_batch() == 0) b->set_vl_micro_batch(1);
  if (b->max_patches_per_chunk() == 0) b->set_max_patches_per_chunk(65536);

  auto* p = c->mutable_packing();
  if (p->strategy().empty()) p->set_strategy("tutti");
  if (p->open_bins() == 0) p->set_open_bins(6);
  if (p->improvement_rounds() == 0) p->set_improvement_rounds(256);

  auto* pb = c->mutable_post_balancing();
  if (pb->rearrangement().empty()) pb->set_rearrangement("fast");
  if (pb->hidden_size() == 0) pb->set_hidden_size(4096);
  if (pb->embedding_dtype() == v1::DTYPE_UNSPECIFIED) pb->set_embedding_dtype(v1::DTYPE_BFLOAT16);
}

absl::Status ParseRatio(const std::string& ratio, uint32_t* a, uint32_t* b) {
  std::vector<std::string> parts = absl::StrSplit(ratio, ':');
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], a) || !absl::SimpleAtoi(parts[1], b) ||
      (*a == 0 && *b == 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch.text_vl_ratio '", ratio,
                     "' is not of the form 'TEXT:VL' with whole numbers, e.g. '4:1'"));
  }
  return absl::OkStatus();
}

absl::StatusOr<MicroBatchSplit> SplitMicroBatches(const v1::BatchConfig& batch) {
  const uint32_t g = batch.grad_accum();
  const uint32_t mt = batch.text_micro_batch(), mv = batch.vl_micro_batch();
  const bool want_text = batch.text_samples_per_step() > 0;
  const bool want_vl = batch.vl_samples_per_step() > 0;
  if (batch.text_vl_ratio().empty()) {
    MicroBatchSplit s;
    if (want_text && want_vl) {
      if (g < 2) {
        return absl::InvalidArgumentError(absl::StrCat(
            "batch.grad_accum is ", g,
            " but text and VL samples need separate micro-batches; set grad_accum >= 2"));
      }
      s.vl_micro_batches = std::max<uint32_t>(1, g / 2);
      s.text_micro_batches = g - s.vl_micro_batches;
    } else if (want_vl) {
      s.vl_micro_batches = g;
    } else {
      s.text_micro_batches = g;
    }
    return s;
  }
  uint32_t rt = 0, rv = 0;
  RETURN_IF_ERROR(ParseRatio(batch.text_vl_ratio(), &rt, &rv));
  // Find n_t + n_v = g with n_t*mt : n_v*mv == rt : rv.
  for (uint32_t nt = 0; nt <= g; ++nt) {
    const uint32_t nv = g - nt;
    if (uint64_t{nt} * mt * rv == uint64_t{nv} * mv * rt) {
      if ((rt > 0) != (nt > 0) || (rv > 0) != (nv > 0)) continue;
      return MicroBatchSplit{nt, nv};
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "batch.text_vl_ratio ", batch.text_vl_ratio(), " cannot be met exactly with grad_accum ", g,
      ", text_micro_batch ", mt, " and vl_micro_batch ", mv, ": no split of the ", g,
      " micro-batches gives text:VL sequences = ", batch.text_vl_ratio(),
      ". For 4:1 use e.g. grad_accum 2, text_micro_batch 4, vl_micro_batch 1"));
}

absl::Status ValidateCostConfig(const v1::JobConfig& c) {
  const v1::CostModel& cm = c.cost();
  const struct {
    const char* name;
    double value;
  } constants[] = {{"vit_linear", cm.vit_linear()},
                   {"vit_quadratic", cm.vit_quadratic()},
                   {"llm_linear", cm.llm_linear()},
                   {"llm_quadratic", cm.llm_quadratic()},
                   {"audio_linear", cm.audio_linear()},
                   {"audio_quadratic", cm.audio_quadratic()},
                   {"p_ref", cm.p_ref()}};
  for (const auto& [name, value] : constants) {
    if (!std::isfinite(value) || value < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cost.", name, " is ", value, "; cost constants are finite and not negative"));
    }
  }
  if (!cm.model().empty()) {
    auto shape = ModelPreset(cm.model());
    if (!shape.ok()) return Annotate(shape.status(), "cost.model");
    const v1::VisionConfig& v = c.vision();
    if (shape->vision.patch_size != v.patch_size() || shape->vision.merge_size != v.merge_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cost.model '", cm.model(), "' has patch size ", shape->vision.patch_size,
          " and merge size ", shape->vision.merge_size, " but vision.patch_size is ",
          v.patch_size(), " and vision.merge_size ", v.merge_size(),
          ": the costs count that model's patches; set vision.patch_size: ",
          shape->vision.patch_size, " and vision.merge_size: ", shape->vision.merge_size));
    }
  }
  const v1::CostFitConfig& f = cm.online_fit();
  if (f.interval_steps() > 1000000 || f.lead_steps() > 1000000) {
    return absl::InvalidArgumentError(absl::StrCat("cost.online_fit.interval_steps ",
                                                   f.interval_steps(), " or lead_steps ",
                                                   f.lead_steps(), " is above 1000000 steps"));
  }
  if (f.window_reports() > 0 && f.window_reports() < f.min_reports()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cost.online_fit.window_reports ", f.window_reports(), " is below min_reports ",
        f.min_reports(), ": a fit would never have the reports it needs"));
  }
  if (f.window_reports() > (1u << 24)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cost.online_fit.window_reports ", f.window_reports(), " is above 16777216"));
  }
  if (!std::isfinite(f.min_change()) || f.min_change() < 0 || f.min_change() >= 1) {
    return absl::InvalidArgumentError(absl::StrCat("cost.online_fit.min_change ", f.min_change(),
                                                   " must be in [0, 1) (0: the default, 0.02)"));
  }
  return absl::OkStatus();
}

absl::Status ValidateJobConfig(const v1::JobConfig& c) {
  if (c.world_size() == 0) {
    return absl::InvalidArgumentError(
        "world_size is 0; it must be at least 1 (the number of ranks)");
  }
  if (c.ranks_per_node() == 0) {
    return absl::InvalidArgumentError(
        "ranks_per_node is 0; it must be at least 1 (the ranks on each node)");
  }
  if (c.world_size() % c.ranks_per_node() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("world_size ", c.world_size(), " is not a multiple of ranks_per_node ",
                     c.ranks_per_node(), "; every node runs the same number of ranks"));
  }
  RETURN_IF_ERROR(CheckJobLimits(c));
  const auto& v = c.vision();
  if (v.mean_size() != 3 || v.std_size() != 3) {
    return absl::InvalidArgumentError("vision.mean and vision.std need exactly 3 values (RGB)");
  }
  for (float s : v.std()) {
    if (s <= 0) return absl::InvalidArgumentError("vision.std values must be positive");
  }
  if (v.output_dtype() != v1::DTYPE_FLOAT32 && v.output_dtype() != v1::DTYPE_BFLOAT16) {
    return absl::InvalidArgumentError(
        "vision.output_dtype must be DTYPE_FLOAT32 or DTYPE_BFLOAT16");
  }
  const double factor = double(v.patch_size()) * v.merge_size();
  uint64_t prev = 0;
  for (int i = 0; i < c.curriculum_size(); ++i) {
    const auto& s = c.curriculum(i);
    if (i == 0 && s.start_step() != 0) {
      return absl::InvalidArgumentError("curriculum[0].start_step must be 0");
    }
    if (i > 0 && s.start_step() <= prev) {
      return absl::InvalidArgumentError(absl::StrCat(
          "curriculum[", i, "].start_step ", s.start_step(), " is not after the previous stage's ",
          prev, "; list stages in increasing start_step"));
    }
    prev = s.start_step();
    if (double(s.max_pixels()) < factor * factor) {
      return absl::InvalidArgumentError(absl::StrCat("curriculum[", i, "].max_pixels ",
                                                     s.max_pixels(), " is below one merged patch (",
                                                     factor * factor, " pixels)"));
    }
    if (s.max_pixels() < v.min_pixels()) {
      return absl::InvalidArgumentError(absl::StrCat("curriculum[", i, "].max_pixels ",
                                                     s.max_pixels(), " is below vision.min_pixels ",
                                                     v.min_pixels()));
    }
    if (s.seq_len() < 16) {
      return absl::InvalidArgumentError(
          absl::StrCat("curriculum[", i, "].seq_len ", s.seq_len(), " is too small (at least 16)"));
    }
  }
  const auto& b = c.batch();
  if (b.text_samples_per_step() == 0 && b.vl_samples_per_step() == 0) {
    return absl::InvalidArgumentError(
        "batch.text_samples_per_step and batch.vl_samples_per_step are both 0; a step needs "
        "samples");
  }
  if (b.text_micro_batch() == 0 || b.vl_micro_batch() == 0) {
    return absl::InvalidArgumentError(
        "batch.text_micro_batch and batch.vl_micro_batch must be >= 1");
  }
  auto split = SplitMicroBatches(b);
  if (!split.ok()) return split.status();
  if (b.text_samples_per_step() > 0 && split->text_micro_batches == 0) {
    return absl::InvalidArgumentError(
        "batch.text_samples_per_step > 0 but the ratio gives no text micro-batches");
  }
  if (b.vl_samples_per_step() > 0 && split->vl_micro_batches == 0) {
    return absl::InvalidArgumentError(
        "batch.vl_samples_per_step > 0 but the ratio gives no VL micro-batches");
  }
  const std::string& st = c.packing().strategy();
  const std::vector<std::string>& names = PackingStrategyNames();
  if (std::find(names.begin(), names.end(), st) == names.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "packing.strategy '", st, "' is unknown; choose one of: ", absl::StrJoin(names, ", ")));
  }
  RETURN_IF_ERROR(ValidateCostConfig(c));
  const std::string& re = c.post_balancing().rearrangement();
  if (re != "fast" && re != "ilp") {
    return absl::InvalidArgumentError(
        absl::StrCat("post_balancing.rearrangement '", re, "' is unknown; choose 'fast' or 'ilp'"));
  }
  RETURN_IF_ERROR(ValidateLocalityConfig(c.locality()));
  return ValidateMixtureConfig(c);
}

absl::Status ValidateLocalityConfig(const v1::LocalityConfig& l) {
  if (l.home_replication() > kMaxHomeReplication) {
    return absl::InvalidArgumentError(absl::StrCat(
        "locality.home_replication ", l.home_replication(), " is above the limit of ",
        kMaxHomeReplication, " home nodes per shard; 1 or 2 are usual (0 turns locality off)"));
  }
  if (l.node_cache_bytes() != 0 && l.home_replication() == 0) {
    return absl::InvalidArgumentError(
        "locality.node_cache_bytes is set but locality.home_replication is 0 (off): the capacity "
        "bounds the shards each node is home to; set home_replication (e.g. 1) or drop "
        "node_cache_bytes");
  }
  return absl::OkStatus();
}

std::string JobFingerprint(const v1::JobConfig& config, absl::string_view index_id) {
  v1::JobConfig identity = config;
  identity.clear_index_path();
  // A mixture source's index file by the order it first appears in: which
  // file each source draws from counts, not how its path is spelled (the
  // index's content identity covers the files' samples). A config without a
  // mixture is left as it is (mutable_mixture() would add an empty one).
  if (identity.has_mixture()) {
    std::vector<std::string> files;
    for (v1::MixtureSource& s : *identity.mutable_mixture()->mutable_sources()) {
      if (s.index_path().empty() || s.index_path() == config.index_path()) {
        s.clear_index_path();
        continue;
      }
      auto at = std::find(files.begin(), files.end(), s.index_path());
      if (at == files.end()) at = files.insert(files.end(), s.index_path());
      s.set_index_path(absl::StrCat("file ", at - files.begin() + 1));
    }
  }
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream out(&bytes);
    google::protobuf::io::CodedOutputStream coded(&out);
    coded.SetSerializationDeterministic(true);
    identity.SerializeToCodedStream(&coded);
  }
  absl::StrAppend(&bytes, "\nindex ", index_id);
  const uint32_t a = Crc32c(bytes);
  const uint32_t b = Crc32cExtend(0x9E3779B9u, bytes.data(), bytes.size());
  return absl::StrCat(absl::Hex(a, absl::kZeroPad8), absl::Hex(b, absl::kZeroPad8));
}

const v1::CurriculumStage& StageAt(const v1::JobConfig& config, uint64_t step) {
  int best = 0;
  for (int i = 0; i < config.curriculum_size(); ++i) {
    if (config.curriculum(i).start_step() <= step) best = i;
  }
  return config.curriculum(best);
}

VisionGeometryOptions GeometryOptions(const v1::JobConfig& config, uint64_t max_pixels) {
  VisionGeometryOptions o;
  const auto& v = config.vision();
  o.patch_size = v.patch_size();
  o.merge_size = v.merge_size();
  o.temporal_patch = v.temporal_patch();
  o.min_pixels = v.min_pixels();
  o.max_pixels = max_pixels;
  o.max_aspect_ratio = v.max_aspect_ratio();
  return o;
}

CostModelOptions CostOptions(const v1::JobConfig& config) {
  CostModelOptions o;
  const auto& c = config.cost();
  o.vit_linear = c.vit_linear();
  o.vit_quadratic = c.vit_quadratic();
  o.llm_linear = c.llm_linear();
  o.llm_quadratic = c.llm_quadratic();
  o.audio_linear = c.audio_linear();
  o.audio_quadratic = c.audio_quadratic();
  return o;
}

}  // namespace tutti
