#include "services/packer/core/plan_check.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace tutti::packer {
namespace {

absl::Status Fail(const std::string& what) { return absl::InternalError(what); }

bool Near(double a, double b) { return std::abs(a - b) <= 1e-9 * std::max({1.0, a, b}); }

// Row r of `lists` must hold exactly the items x with from(x) == r, ordered
// by (to(x), order(x)); `want` says which items take part.
template <typename Want, typename From, typename To, typename Order>
absl::Status CheckLists(const char* what, const Csr& lists, uint32_t W, uint32_t n, Want want,
                        From from, To to, Order order) {
  if (lists.rows() != W) {
    return Fail(absl::StrCat(what, " lists have ", lists.rows(), " rows for ", W, " ranks"));
  }
  std::vector<uint8_t> seen(n, 0);
  for (uint32_t r = 0; r < W; ++r) {
    for (uint32_t k = 0; k < lists.size(r); ++k) {
      const uint32_t x = lists.row(r)[k];
      if (x >= n || !want(x) || from(x) != r) {
        return Fail(absl::StrCat(what, " list of rank ", r, " holds item ", x,
                                 ", which is not one of its items"));
      }
      if (seen[x]++) return Fail(absl::StrCat(what, ": item ", x, " is listed twice"));
      if (k > 0) {
        const uint32_t p = lists.row(r)[k - 1];
        if (std::make_pair(to(p), order(p)) >= std::make_pair(to(x), order(x))) {
          return Fail(absl::StrCat(what, " list of rank ", r, " is not ordered by peer, item"));
        }
      }
    }
  }
  for (uint32_t x = 0; x < n; ++x) {
    if (want(x) && !seen[x]) return Fail(absl::StrCat(what, ": item ", x, " is in no list"));
  }
  return absl::OkStatus();
}

absl::Status CheckPlacement(const StepPlanData& p, const PlanCheckOptions& o) {
  const uint32_t W = p.world_size, S = p.seqs_per_rank();
  const uint32_t n = static_cast<uint32_t>(p.samples.size());
  // (sample, piece): a split document's pieces (overflow.h) are one sample.
  absl::flat_hash_set<uint64_t> ids;
  absl::flat_hash_set<uint64_t> piece_seqs;  // (sample, sequence) of pieces
  for (uint32_t k = 0; k < n; ++k) {
    const PlannedSample& s = p.samples[k];
    if (!ids.insert(uint64_t{s.sample} << 32 | s.piece).second) {
      return Fail(absl::StrCat("index sample ", s.sample, " appears twice in step ", p.step));
    }
    if (s.pieces > 0) {
      // Pieces come in order, each as its own document of its own sequence.
      const bool first = k == 0 || p.samples[k - 1].sample != s.sample;
      if (s.piece >= s.pieces || (first ? s.piece != 0 : p.samples[k - 1].piece + 1 != s.piece) ||
          (s.piece + 1 == s.pieces) != (k + 1 == n || p.samples[k + 1].sample != s.sample)) {
        return Fail(absl::StrCat("sample ", s.sample, " piece ", s.piece, " of ", s.pieces,
                                 " is out of order or incomplete in step ", p.step));
      }
      if (!piece_seqs.insert(uint64_t{s.sample} << 32 | (s.rank * S + s.seq)).second) {
        return Fail(absl::StrCat("two pieces of sample ", s.sample, " share rank ", s.rank,
                                 " sequence ", s.seq, " in step ", p.step));
      }
    }
    if (s.rank >= W || s.seq >= S || (s.seq >= p.text_seqs) != s.vl) {
      return Fail(absl::StrCat("sample ", s.sample, " sits in rank ", s.rank, " sequence ", s.seq,
                               ", not a ", s.vl ? "VL" : "text", " sequence of the world"));
    }
  }
  if (p.docs.rows() != W * S) return Fail("the docs lists do not cover every sequence");
  std::vector<uint8_t> seen(n, 0);
  for (uint32_t g = 0; g < W * S; ++g) {
    uint64_t tokens = 0, image_tokens = 0;
    for (uint32_t k = 0; k < p.docs.size(g); ++k) {
      const uint32_t d = p.docs.row(g)[k];
      if (d >= n || p.samples[d].rank * S + p.samples[d].seq != g || seen[d]++) {
        return Fail(absl::StrCat("sequence ", g % S, " of rank ", g / S,
                                 " lists a document that is not placed there"));
      }
      tokens += p.samples[d].cost.llm_tokens;
      image_tokens += p.samples[d].cost.image_tokens;
    }
    if (tokens > p.seq_len) {
      return Fail(absl::StrCat("sequence ", g % S, " of rank ", g / S, " holds ", tokens,
                               " tokens, above seq_len ", p.seq_len));
    }
    if (o.img_cap > 0 && image_tokens > o.img_cap) {
      return Fail(absl::StrCat("sequence ", g % S, " of rank ", g / S, " holds ", image_tokens,
                               " image tokens, above img_cap ", o.img_cap));
    }
  }
  for (uint32_t d = 0; d < n; ++d) {
    if (!seen[d]) return Fail(absl::StrCat("sample ", p.samples[d].sample, " is in no sequence"));
  }
  return absl::OkStatus();
}

absl::Status CheckLoads(const StepPlanData& p, const PlanCheckOptions& o) {
  const uint32_t rpn = std::max<uint32_t>(1, p.ranks_per_node);
  const dispatch::ShardAvailability everywhere;
  const dispatch::ShardAvailability& av = o.staging != nullptr ? *o.staging : everywhere;
  for (uint32_t x = 0; x < p.num_load_items(); ++x) {
    const uint32_t shard = p.samples[p.LoadOwner(x)].shard;
    const bool staged = av.Has(shard, p.LoadDest(x) / rpn);
    if (p.IsRemoteLoad(x) == staged) {
      return Fail(absl::StrCat("load item ", x, " of sample ", p.samples[p.LoadOwner(x)].sample,
                               staged ? " is remote although its node stages shard "
                                      : " is local although its node lacks shard ",
                               shard));
    }
    if (p.IsRemoteLoad(x) && !av.Has(shard, p.LoadSource(x) / rpn)) {
      return Fail(absl::StrCat("load item ", x, " comes from rank ", p.LoadSource(x),
                               ", whose node does not stage shard ", shard));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckTotals(const StepPlanData& p) {
  const uint32_t W = p.world_size;
  std::vector<double> vit(W, 0), llm(W, 0);
  std::vector<uint64_t> tokens(W, 0);
  for (const PlannedSample& s : p.samples) {
    llm[s.rank] += s.cost.llm;
    tokens[s.rank] += s.cost.llm_tokens;
  }
  for (const PlannedImage& im : p.images) vit[im.enc_rank] += im.cost;
  if (p.ranks.size() != W) return Fail("per-rank totals do not cover the world");
  double vit_max = 0, llm_max = 0;
  for (uint32_t r = 0; r < W; ++r) {
    if (!Near(p.ranks[r].vit, vit[r]) || !Near(p.ranks[r].llm, llm[r]) ||
        p.ranks[r].llm_tokens != tokens[r]) {
      return Fail(absl::StrCat("rank ", r, "'s totals do not match its placement"));
    }
    vit_max = std::max(vit_max, vit[r]);
    llm_max = std::max(llm_max, llm[r]);
  }
  if (!p.images.empty() && !Near(p.vit.max, vit_max)) {
    return Fail(
        absl::StrCat("the ViT phase reports max ", p.vit.max, ", the placement gives ", vit_max));
  }
  if (!p.phases_from_dispatcher && !Near(p.llm.max, llm_max)) {
    return Fail(
        absl::StrCat("the LLM phase reports max ", p.llm.max, ", the placement gives ", llm_max));
  }
  return absl::OkStatus();
}

// Each encoder item's place in its LLM rank's input_ids (sequences in
// order, a document's images then its audio clips) into `in_ids`.
void InputIdsPlaces(const StepPlanData& p, std::vector<uint32_t>* in_ids) {
  const uint32_t W = p.world_size, S = p.seqs_per_rank();
  const uint32_t I = static_cast<uint32_t>(p.images.size());
  for (uint32_t r = 0; r < W; ++r) {
    uint32_t at = 0;
    for (uint32_t g = r * S; g < (r + 1) * S; ++g) {
      for (uint32_t k = 0; k < p.docs.size(g); ++k) {
        const PlannedSample& ps = p.samples[p.docs.row(g)[k]];
        for (uint32_t j = 0; j < ps.cost.images + ps.cost.audio; ++j) {
          const bool image = j < ps.cost.images;
          const uint32_t x = image ? ps.first_image + j : I + ps.first_audio + j - ps.cost.images;
          (*in_ids)[x] = at++;
        }
      }
    }
  }
}

// Each rank's encoder images and audio clips in the order of its sends, so
// that a pair's items are adjacent in the encoder's output.
absl::Status CheckEncoderRowsFollowSends(const StepPlanData& p) {
  const uint32_t I = static_cast<uint32_t>(p.images.size());
  for (uint32_t r = 0; r < p.world_size; ++r) {
    uint32_t image_at = 0, audio_at = 0;
    for (uint32_t k = 0; k < p.sends.size(r); ++k) {
      const uint32_t x = p.sends.row(r)[k];
      const bool image = x < I;
      const Csr& rows = image ? p.enc_images : p.enc_audio;
      uint32_t& at = image ? image_at : audio_at;
      if (at >= rows.size(r) || rows.row(r)[at] != (image ? x : x - I)) {
        return Fail(absl::StrCat("rank ", r, "'s encoder ", image ? "images" : "audio clips",
                                 " do not follow its send list at position ", at));
      }
      ++at;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckPlannedStep(const StepPlanData& p, const PlanCheckOptions& o) {
  if (absl::Status s = CheckPlacement(p, o); !s.ok()) return s;
  const uint32_t W = p.world_size, I = p.num_encoder_items();
  if (p.enc_images.rows() != W) return Fail("the encoder lists do not cover the world");
  std::vector<uint8_t> encoded(p.images.size(), 0);
  for (uint32_t r = 0; r < W; ++r) {
    for (uint32_t k = 0; k < p.enc_images.size(r); ++k) {
      const uint32_t i = p.enc_images.row(r)[k];
      if (i >= p.images.size() || p.images[i].enc_rank != r || encoded[i]++) {
        return Fail(absl::StrCat("rank ", r, " encodes image ", i, " that is not placed there"));
      }
    }
  }
  if (std::count(encoded.begin(), encoded.end(), 0) > 0) return Fail("an image is encoded nowhere");
  auto all = [](uint32_t) { return true; };
  auto enc = [&](uint32_t x) { return p.EncRank(x); };
  auto llm = [&](uint32_t x) { return p.LlmRank(x); };
  // With items that move, a pair's items are its images, then its audio
  // clips, each in the LLM rank's input_ids order (exchange.h), recomputed
  // here from the documents; else batch order.
  std::vector<uint32_t> in_ids(I);
  for (uint32_t x = 0; x < I; ++x) in_ids[x] = x;
  if (p.items_move) InputIdsPlaces(p, &in_ids);
  const uint32_t images = static_cast<uint32_t>(p.images.size());
  auto order = [&](uint32_t x) { return uint64_t{x >= images} << 32 | in_ids[x]; };
  if (absl::Status s = CheckLists("forward send", p.sends, W, I, all, enc, llm, order); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckLists("forward receive", p.recvs, W, I, all, llm, enc, order);
      !s.ok()) {
    return s;
  }
  // Each encoder's rows are grouped by destination: the send list's items of
  // that encoder, in order.
  if (absl::Status s = CheckEncoderRowsFollowSends(p); !s.ok()) return s;
  const uint32_t rpn = std::max<uint32_t>(1, p.ranks_per_node);
  uint64_t inter = 0, intra = 0;
  for (uint32_t x = 0; x < I; ++x) {
    if (enc(x) == llm(x)) continue;
    (enc(x) / rpn == llm(x) / rpn ? intra : inter) += p.OutputBytes(x);
  }
  if (inter != p.inter_node_bytes || intra != p.intra_node_bytes) {
    return Fail(absl::StrCat("forward bytes: inter-node ", p.inter_node_bytes, " / intra-node ",
                             p.intra_node_bytes, " reported, ", inter, " / ", intra, " listed"));
  }
  if (absl::Status s = CheckLoads(p, o); !s.ok()) return s;
  const uint32_t L = p.num_load_items();
  auto remote = [&](uint32_t x) { return p.IsRemoteLoad(x); };
  auto src = [&](uint32_t x) { return p.LoadSource(x); };
  auto dst = [&](uint32_t x) { return p.LoadDest(x); };
  auto item = [](uint32_t x) { return x; };
  if (absl::Status s = CheckLists("load send", p.load_sends, W, L, remote, src, dst, item);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckLists("load receive", p.load_recvs, W, L, remote, dst, src, item);
      !s.ok()) {
    return s;
  }
  uint64_t load_bytes = 0;
  for (uint32_t x = 0; x < L; ++x) load_bytes += remote(x) ? p.LoadBytes(x) : 0;
  if (load_bytes != p.remote_load_bytes) {
    return Fail(absl::StrCat("load exchange: ", p.remote_load_bytes, " bytes reported, ",
                             load_bytes, " listed"));
  }
  return CheckTotals(p);
}

}  // namespace tutti::packer
