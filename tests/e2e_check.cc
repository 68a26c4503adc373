#include "tests/e2e_check.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <cmath>
#include <cstring>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/exchange_pattern.h"
#include "common/rng.h"
#include "common/crc32c.h"
#include "common/dtype.h"
#include "common/status.h"
#include "tutti/v1/stager.pb.h"

namespace tutti::e2e {
namespace {

// The seed of the bytes that stand for an item's encoder output: derived
// from the CRC of the pixels it was encoded from, its identity and the
// direction (salt).
uint64_t ItemSeed(const v1::TransferItem& item, uint32_t crc, uint64_t salt) {
  return Mix64(Mix64(Mix64(salt ^ item.sample_id()) ^ item.index()) ^ crc);
}

constexpr uint64_t kForward = 0x66776420u, kBackward = 0x62776420u;

std::string Where(const Batch& b) { return absl::StrCat("step ", b.step(), ", rank ", b.rank()); }

// Lays out a buffer over `transfers` with each item's content; refuses an
// item whose pixels are unknown or whose size disagrees with its tokens.
absl::Status Fill(const google::protobuf::RepeatedPtrField<v1::Transfer>& transfers,
                  const std::map<ImageKey, ImageFacts>& images, const Geometry& geo, uint64_t salt,
                  int32_t expect_encoder_rank, std::vector<uint8_t>* buf) {
  uint64_t total = 0;
  for (const auto& t : transfers) total += t.bytes();
  buf->assign(total, 0);
  uint64_t off = 0;
  for (const auto& t : transfers) {
    for (const auto& item : t.items()) {
      if (item.encoder() != v1::ENCODER_VISION) {
        return absl::InvalidArgumentError(
            absl::StrCat("item of sample ", item.sample_id(), " is not a vision item"));
      }
      auto it = images.find({item.sample_id(), item.index()});
      if (it == images.end()) {
        return absl::NotFoundError(absl::StrCat("image ", item.index(), " of sample ",
                                                item.sample_id(), " (peer ", t.peer(),
                                                ") is encoded by no rank"));
      }
      const ImageFacts& f = it->second;
      const int32_t encoder =
          expect_encoder_rank >= 0 ? expect_encoder_rank : static_cast<int32_t>(t.peer());
      if (f.rank != encoder) {
        return absl::FailedPreconditionError(
            absl::StrCat("image ", f.index, " of sample ", f.sample_id, " is encoded on rank ",
                         f.rank, " but the exchange moves it from rank ", encoder));
      }
      if (item.bytes() != uint64_t{f.llm_tokens} * geo.embedding_bytes_per_token) {
        return absl::InvalidArgumentError(
            absl::StrCat("image ", f.index, " of sample ", f.sample_id, " has ", f.llm_tokens,
                         " LLM tokens but its exchange item is ", item.bytes(), " bytes, not ",
                         uint64_t{f.llm_tokens} * geo.embedding_bytes_per_token));
      }
      if (off + item.bytes() > total)
        return absl::InvalidArgumentError("items overrun the transfers");
      FillSeedStream(ItemSeed(item, f.crc, salt), buf->data() + off, item.bytes());
      off += item.bytes();
    }
  }
  if (off != total)
    return absl::InvalidArgumentError("transfers' items do not add up to their bytes");
  return absl::OkStatus();
}

absl::Status Compare(const char* what, const std::vector<uint8_t>& expected,
                     const std::vector<uint8_t>& got) {
  if (expected.size() != got.size()) {
    return absl::DataLossError(
        absl::StrCat(what, ": ", got.size(), " bytes, expected ", expected.size()));
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (expected[i] != got[i]) {
      return absl::DataLossError(
          absl::StrCat(what, ": byte ", i, " is ", int{got[i]}, ", expected ", int{expected[i]}));
    }
  }
  return absl::OkStatus();
}

}  // namespace

Geometry GeometryOf(const v1::JobConfig& c) {
  Geometry g;
  g.patch = c.vision().patch_size();
  g.temporal_patch = c.vision().temporal_patch();
  g.row_values = uint64_t{3} * g.temporal_patch * g.patch * g.patch;
  g.image_pad_id = static_cast<int32_t>(c.vision().image_pad_id());
  g.vision_start_id = static_cast<int32_t>(c.vision().vision_start_id());
  g.vision_end_id = static_cast<int32_t>(c.vision().vision_end_id());
  g.embedding_bytes_per_token =
      uint64_t{c.post_balancing().hidden_size()} * DTypeSize(c.post_balancing().embedding_dtype());
  return g;
}

std::vector<int64_t> RankReport::Encode() const {
  std::vector<int64_t> v = {rank, static_cast<int64_t>(plan_hash), static_cast<int64_t>(input_ids),
                            static_cast<int64_t>(docs.size())};
  for (const DocFacts& d : docs) {
    v.insert(v.end(), {static_cast<int64_t>(d.sample_id), d.length, d.image_pads, d.vision_starts});
  }
  v.push_back(static_cast<int64_t>(images.size()));
  for (const ImageFacts& f : images) {
    v.insert(v.end(), {static_cast<int64_t>(f.sample_id), f.index, f.t, f.h, f.w,
                       static_cast<int64_t>(f.rows), f.crc, f.llm_tokens, f.rank});
  }
  return v;
}

RankReport RankReport::Decode(const std::vector<int64_t>& v) {
  RankReport r;
  size_t i = 0;
  auto next = [&]() -> int64_t { return i < v.size() ? v[i++] : 0; };
  r.rank = static_cast<int32_t>(next());
  r.plan_hash = static_cast<uint64_t>(next());
  r.input_ids = static_cast<uint64_t>(next());
  for (int64_t n = next(); n > 0; --n) {
    DocFacts d;
    d.sample_id = static_cast<uint64_t>(next());
    d.length = static_cast<uint32_t>(next());
    d.image_pads = static_cast<uint32_t>(next());
    d.vision_starts = static_cast<uint32_t>(next());
    r.docs.push_back(d);
  }
  for (int64_t n = next(); n > 0; --n) {
    ImageFacts f;
    f.sample_id = static_cast<uint64_t>(next());
    f.index = static_cast<uint32_t>(next());
    f.t = static_cast<uint32_t>(next());
    f.h = static_cast<uint32_t>(next());
    f.w = static_cast<uint32_t>(next());
    f.rows = static_cast<uint64_t>(next());
    f.crc = static_cast<uint32_t>(next());
    f.llm_tokens = static_cast<uint32_t>(next());
    f.rank = static_cast<int32_t>(next());
    r.images.push_back(f);
  }
  return r;
}

uint64_t PlanHash(const v1::RankPlan& plan) {
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream sos(&bytes);
    google::protobuf::io::CodedOutputStream cos(&sos);
    cos.SetSerializationDeterministic(true);
    plan.SerializeToCodedStream(&cos);
  }
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
  return h;
}

absl::Status CheckBatch(const Batch& batch, const Geometry& geo, RankReport* report) {
  const std::string where = Where(batch);
  const v1::RankPlan& plan = batch.plan();
  report->rank = static_cast<int32_t>(batch.rank());
  report->plan_hash = PlanHash(plan);
  if (!batch.skipped().empty()) {
    const v1::SkippedSample& s = batch.skipped()[0];
    return absl::DataLossError(absl::StrCat(where, ": the stager skipped ", batch.skipped().size(),
                                            " samples, first ", s.sample_id(), " (", s.reason(),
                                            ": ", s.detail(), ")"));
  }
  if (plan.rank() != batch.rank()) {
    return absl::InternalError(
        absl::StrCat(where, ": the batch carries the plan of rank ", plan.rank()));
  }
  std::map<uint64_t, const v1::SampleInfo*> samples;
  for (const v1::SampleInfo& s : batch.samples()) samples[s.sample_id()] = &s;

  // Images: grids, sample ids and pixel rows as planned.
  std::vector<const v1::ImagePlan*> planned;
  for (const v1::EncoderPhase& e : plan.encoders()) {
    if (e.encoder() == v1::ENCODER_VISION) {
      for (const v1::ImagePlan& ip : e.images()) planned.push_back(&ip);
    }
  }
  const auto grid = batch.image_grid_thw();
  const auto image_ids = batch.image_sample_ids();
  if (grid.size() != 3 * planned.size() || image_ids.size() != planned.size()) {
    return absl::DataLossError(absl::StrCat(where, ": ", planned.size(), " images planned but ",
                                            grid.size() / 3, " grids and ", image_ids.size(),
                                            " image sample ids delivered"));
  }
  uint64_t rows = 0;
  for (const v1::ImagePlan* ip : planned) rows += ip->patches();
  const ArrayView* px = batch.pixel_values();
  if (!planned.empty()) {
    if (px == nullptr || px->shape.size() != 2 || px->shape[0] != rows ||
        px->shape[1] != geo.row_values) {
      return absl::DataLossError(
          absl::StrCat(where, ": pixel_values should be [", rows, ", ", geo.row_values, "], got ",
                       px == nullptr ? "nothing"
                                     : absl::StrCat(px->shape.size(), "-d ", px->shape[0], " x ",
                                                    px->shape.size() > 1 ? px->shape[1] : 0)));
    }
  }
  const uint64_t row_bytes = geo.row_values * (px != nullptr ? DTypeSize(px->dtype) : 4);
  uint64_t row = 0;
  for (size_t i = 0; i < planned.size(); ++i) {
    const v1::ImagePlan& ip = *planned[i];
    ImageFacts f;
    f.sample_id = ip.sample_id();
    f.index = ip.image_index();
    f.t = static_cast<uint32_t>(grid[3 * i]);
    f.h = static_cast<uint32_t>(grid[3 * i + 1]);
    f.w = static_cast<uint32_t>(grid[3 * i + 2]);
    f.rows = uint64_t{f.t} * f.h * f.w;
    f.llm_tokens = ip.llm_tokens();
    f.rank = static_cast<int32_t>(batch.rank());
    if (static_cast<uint64_t>(image_ids[i]) != ip.sample_id() || f.t != ip.grid_t() ||
        f.h != ip.grid_h() || f.w != ip.grid_w() || f.rows != ip.patches()) {
      return absl::DataLossError(
          absl::StrCat(where, ": image ", i, " is sample ", image_ids[i], " grid (", f.t, ",", f.h,
                       ",", f.w, "); the plan says sample ", ip.sample_id(), " grid (", ip.grid_t(),
                       ",", ip.grid_h(), ",", ip.grid_w(), ") = ", ip.patches(), " patches"));
    }
    if (ip.grid_h() * geo.patch != ip.resized_height() ||
        ip.grid_w() * geo.patch != ip.resized_width()) {
      return absl::DataLossError(absl::StrCat(where, ": image ", i,
                                              " grid does not match its size ", ip.resized_width(),
                                              "x", ip.resized_height()));
    }
    const char* base = static_cast<const char*>(px->data) + row * row_bytes;
    f.crc = Crc32cExtend(0, base, f.rows * row_bytes);
    if (px->dtype == v1::DTYPE_FLOAT32) {
      const float* v = reinterpret_cast<const float*>(base);
      for (uint64_t k = 0; k < f.rows * geo.row_values; ++k) {
        if (!std::isfinite(v[k]) || std::fabs(v[k]) > 4.0f) {
          return absl::DataLossError(absl::StrCat(where, ": image ", i, " (sample ", f.sample_id,
                                                  ") has pixel value ", v[k], " at ", k,
                                                  ", not a normalised pixel"));
        }
      }
    }
    row += f.rows;
    report->images.push_back(f);
  }

  // Documents: order, lengths, token boundaries, encoder markers.
  const auto ids = batch.input_ids();
  const auto cu = batch.cu_seqlens();
  const auto seqs = batch.seq_offsets();
  const auto mbs = batch.micro_batch_offsets();
  const auto doc_ids = batch.doc_sample_ids();
  std::vector<const v1::DocSlot*> slots;
  std::vector<uint32_t> seq_tokens;
  std::vector<uint32_t> mb_seqs;
  uint64_t tokens = 0;
  for (const v1::MicroBatch& mb : plan.micro_batches()) {
    mb_seqs.push_back(static_cast<uint32_t>(mb.sequences_size()));
    for (const v1::Sequence& seq : mb.sequences()) {
      seq_tokens.push_back(seq.tokens());
      tokens += seq.tokens();
      for (const v1::DocSlot& d : seq.docs()) {
        slots.push_back(&d);
        auto it = samples.find(d.sample_id());
        if (it == samples.end()) {
          return absl::DataLossError(
              absl::StrCat(where, ": no SampleInfo for document sample ", d.sample_id()));
        }
        if (it->second->modality() != mb.modality()) {
          return absl::DataLossError(absl::StrCat(
              where, ": sample ", d.sample_id(), " of modality ", it->second->modality(),
              " sits in a micro-batch of modality ", mb.modality()));
        }
      }
    }
  }
  if (ids.size() != tokens) {
    return absl::DataLossError(
        absl::StrCat(where, ": input_ids has ", ids.size(), " tokens, the plan ", tokens));
  }
  if (doc_ids.size() != slots.size() || cu.size() != slots.size() + 1 || cu[0] != 0 ||
      static_cast<uint64_t>(cu.back()) != ids.size()) {
    return absl::DataLossError(absl::StrCat(where, ": ", slots.size(), " documents planned; got ",
                                            doc_ids.size(), " doc_sample_ids and ", cu.size(),
                                            " cu_seqlens ending at ", cu.empty() ? -1 : cu.back()));
  }
  if (seqs.size() != seq_tokens.size() + 1 || mbs.size() != mb_seqs.size() + 1) {
    return absl::DataLossError(absl::StrCat(where, ": seq_offsets/micro_batch_offsets sizes ",
                                            seqs.size(), "/", mbs.size(), ", expected ",
                                            seq_tokens.size() + 1, "/", mb_seqs.size() + 1));
  }
  for (size_t s = 0; s < seq_tokens.size(); ++s) {
    if (static_cast<uint32_t>(seqs[s + 1] - seqs[s]) != seq_tokens[s]) {
      return absl::DataLossError(absl::StrCat(where, ": sequence ", s, " has ",
                                              seqs[s + 1] - seqs[s], " tokens, planned ",
                                              seq_tokens[s]));
    }
  }
  for (size_t m = 0, at = 0; m < mb_seqs.size(); at += mb_seqs[m], ++m) {
    if (static_cast<size_t>(mbs[m]) != at) {
      return absl::DataLossError(absl::StrCat(where, ": micro-batch ", m, " starts at sequence ",
                                              mbs[m], ", planned ", at));
    }
  }
  std::set<int32_t> seq_starts(seqs.begin(), seqs.end());
  for (size_t d = 0; d < slots.size(); ++d) {
    const v1::DocSlot& slot = *slots[d];
    DocFacts f;
    f.sample_id = static_cast<uint64_t>(doc_ids[d]);
    f.length = static_cast<uint32_t>(cu[d + 1] - cu[d]);
    if (f.sample_id != slot.sample_id() || f.length != slot.length()) {
      return absl::DataLossError(absl::StrCat(where, ": document ", d, " is sample ", f.sample_id,
                                              " of ", f.length, " tokens; planned sample ",
                                              slot.sample_id(), " of ", slot.length()));
    }
    for (int32_t k = cu[d]; k < cu[d + 1]; ++k) {
      if (ids[k] == geo.image_pad_id) ++f.image_pads;
      if (ids[k] == geo.vision_start_id) ++f.vision_starts;
    }
    const uint32_t images = static_cast<uint32_t>(samples[f.sample_id]->images_size());
    if (f.vision_starts != images) {
      return absl::DataLossError(absl::StrCat(where, ": document of sample ", f.sample_id, " has ",
                                              f.vision_starts, " vision_start tokens for ", images,
                                              " images"));
    }
    report->docs.push_back(f);
  }
  report->input_ids = ids.size();
  return absl::OkStatus();
}

absl::Status CheckStep(const v1::StepPlan& plan, const v1::JobConfig& config,
                       const std::vector<RankReport>& reports) {
  const std::string where = absl::StrCat("step ", plan.step());
  if (plan.ranks_size() != static_cast<int>(reports.size())) {
    return absl::FailedPreconditionError(absl::StrCat(
        where, ": the packer planned ", plan.ranks_size(), " ranks, ", reports.size(), " ran"));
  }
  std::map<uint64_t, const v1::SampleInfo*> batch;  // the global batch
  for (const v1::SampleInfo& s : plan.samples()) batch[s.sample_id()] = &s;
  uint32_t text = 0, vl = 0;
  for (const auto& [id, s] : batch) (s->modality() == v1::MODALITY_VL ? vl : text)++;
  if (text != config.batch().text_samples_per_step() ||
      vl != config.batch().vl_samples_per_step()) {
    return absl::DataLossError(absl::StrCat(
        where, ": the global batch has ", text, " text and ", vl, " VL samples; the job draws ",
        config.batch().text_samples_per_step(), " and ", config.batch().vl_samples_per_step()));
  }
  std::map<ImageKey, ImageFacts> images;
  std::map<uint64_t, int> doc_rank;
  for (size_t r = 0; r < reports.size(); ++r) {
    const RankReport& rep = reports[r];
    if (PlanHash(plan.ranks(r)) != rep.plan_hash) {
      return absl::DataLossError(absl::StrCat(where, ", rank ", r,
                                              ": the stager delivered a plan that differs from the "
                                              "packer's GetPlan"));
    }
    for (const ImageFacts& f : rep.images) {
      if (!images.emplace(f.key(), f).second) {
        return absl::DataLossError(absl::StrCat(where, ": image ", f.index, " of sample ",
                                                f.sample_id, " is encoded on rank ",
                                                images[f.key()].rank, " and again on rank ", r));
      }
    }
    for (const DocFacts& d : rep.docs) {
      if (!batch.count(d.sample_id)) {
        return absl::DataLossError(absl::StrCat(where, ": rank ", r, " got sample ", d.sample_id,
                                                ", which is not in the step's global batch"));
      }
      if (auto [it, fresh] = doc_rank.emplace(d.sample_id, static_cast<int>(r)); !fresh) {
        return absl::DataLossError(absl::StrCat(where, ": sample ", d.sample_id, " is on rank ",
                                                it->second, " and again on rank ", r));
      }
    }
  }
  for (const auto& [id, s] : batch) {
    if (!doc_rank.count(id)) {
      return absl::DataLossError(
          absl::StrCat(where, ": sample ", id, " of the global batch reached no rank"));
    }
    for (int i = 0; i < s->images_size(); ++i) {
      if (!images.count({id, static_cast<uint32_t>(i)})) {
        return absl::DataLossError(
            absl::StrCat(where, ": image ", i, " of sample ", id, " was encoded by no rank"));
      }
    }
    if ((s->modality() == v1::MODALITY_VL) != (s->images_size() > 0)) {
      return absl::DataLossError(absl::StrCat(where, ": sample ", id, " has modality ",
                                              s->modality(), " and ", s->images_size(), " images"));
    }
  }
  for (const auto& [key, f] : images) {
    auto it = batch.find(key.first);
    if (it == batch.end() || key.second >= static_cast<uint32_t>(it->second->images_size())) {
      return absl::DataLossError(absl::StrCat(where, ": rank ", f.rank, " encoded image ",
                                              key.second, " of sample ", key.first,
                                              ", which the batch does not hold"));
    }
  }
  for (const RankReport& rep : reports) {
    for (const DocFacts& d : rep.docs) {
      uint64_t tokens = 0;
      for (int i = 0; i < batch[d.sample_id]->images_size(); ++i) {
        tokens += images[{d.sample_id, static_cast<uint32_t>(i)}].llm_tokens;
      }
      if (d.image_pads != tokens) {
        return absl::DataLossError(
            absl::StrCat(where, ", rank ", rep.rank, ": document of sample ", d.sample_id, " has ",
                         d.image_pads, " image pads; its images make ", tokens, " LLM tokens"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ExchangeContents(Client& client, const Batch& batch, const Geometry& geo,
                              const std::map<ImageKey, ImageFacts>& images) {
  const std::string where = Where(batch);
  const v1::Exchange& ex = batch.plan().exchange();
  const int32_t me = static_cast<int32_t>(batch.rank());
  // Every rank runs both exchanges whatever it finds, so that none waits
  // forever; the first problem is returned after.
  std::vector<uint8_t> send, recv(ex.recv_bytes()), expect;
  absl::Status local = Fill(ex.sends(), images, geo, kForward, me, &send);
  if (!local.ok()) send.assign(ex.send_bytes(), 0);
  absl::Status fwd = client.Exchange(batch, send.data(), send.size(), recv.data(), recv.size());
  absl::Status check = fwd;
  if (check.ok()) check = Fill(ex.recvs(), images, geo, kForward, -1, &expect);
  if (check.ok()) check = Compare("forward exchange", expect, recv);

  // The rank receives exactly the images of its own documents.
  if (check.ok()) {
    std::multiset<ImageKey> got, want;
    for (const auto& t : ex.recvs()) {
      for (const auto& item : t.items()) got.insert({item.sample_id(), item.index()});
    }
    std::map<uint64_t, int> images_of;
    for (const v1::SampleInfo& s : batch.samples()) images_of[s.sample_id()] = s.images_size();
    uint64_t pads = 0, received = 0;
    for (int64_t id : batch.doc_sample_ids()) {
      for (int i = 0; i < images_of[static_cast<uint64_t>(id)]; ++i) {
        want.insert({static_cast<uint64_t>(id), static_cast<uint32_t>(i)});
      }
    }
    for (int32_t t : batch.input_ids()) pads += (t == geo.image_pad_id);
    for (const auto& k : got) received += images.at(k).llm_tokens;
    if (got != want) {
      check = absl::DataLossError(absl::StrCat("receives ", got.size(),
                                               " encoder outputs but its documents hold ",
                                               want.size(), " images"));
    } else if (pads != received) {
      check = absl::DataLossError(absl::StrCat(
          "its input_ids hold ", pads, " image pads but it receives ", received, " image tokens"));
    }
  }

  // Backward: gradients travel back to the encoder ranks.
  std::vector<uint8_t> bsend, brecv(ex.send_bytes());
  absl::Status bfill =
      fwd.ok() ? Fill(ex.recvs(), images, geo, kBackward, -1, &bsend) : absl::OkStatus();
  if (!fwd.ok() || !bfill.ok()) bsend.assign(ex.recv_bytes(), 0);
  absl::Status bwd =
      client.ExchangeBackward(batch, bsend.data(), bsend.size(), brecv.data(), brecv.size());
  absl::Status bcheck = bwd;
  if (bcheck.ok()) bcheck = Fill(ex.sends(), images, geo, kBackward, me, &expect);
  if (bcheck.ok()) bcheck = Compare("backward exchange", expect, brecv);

  for (const absl::Status* s : {&local, &fwd, &check, &bfill, &bwd, &bcheck}) {
    RETURN_IF_ERROR(Annotate(*s, where));
  }
  return absl::OkStatus();
}

}  // namespace tutti::e2e
