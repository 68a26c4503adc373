// Exchange lists: the all-to-all that carries every encoder output from the
// rank that encoded it to the rank whose LLM phase consumes it.
//
// For rank r, sends are its encoder items grouped by destination rank
// (ascending), recvs the items its LLM phase needs grouped by source rank,
// so both ends agree on the buffer layout. Transfers to the rank itself are
// listed too. Bytes between ranks of different nodes (node = rank /
// ranks_per_node) count as inter-node.
//
// Every pair is one contiguous run at both ends (plan_version 4): a pair's
// items are its images, then its audio clips, each kind in the LLM rank's
// input_ids order, and each rank's encoder images and audio clips follow its
// sends. So each encoder's output rows on the encoding rank are grouped by
// destination, and a receive buffer laid out by source holds each source's
// rows back to back; the LLM rank places them through an index, so the
// order of its documents does not matter. When every item stays on its rank
// (no post-balancing), a rank's items are in batch order (images, then
// audio clips).
#ifndef TUTTI_SERVICES_PACKER_CORE_EXCHANGE_H_
#define TUTTI_SERVICES_PACKER_CORE_EXCHANGE_H_

#include "services/packer/core/plan_data.h"

namespace tutti::packer {

// Fills plan->sends, recvs, items_move, inter_node_bytes and
// intra_node_bytes; with items that move, reorders the rows of enc_images
// and enc_audio to follow the sends (chunks must be built after it).
void BuildExchange(StepPlanData* plan);
// The same from every encoder item's encoder rank and LLM rank, as read
// already (enc[i] = plan->EncRank(i), llm[i] = plan->LlmRank(i)).
void BuildExchange(const uint32_t* enc, const uint32_t* llm, StepPlanData* plan);

// The load exchange of post-balancing: every remote-loaded input (an image's
// pixels, an audio clip's samples, a document's token ids) from the rank
// that loads it (load_source / text_source) to the rank that needs it (its
// encoder rank / LLM rank), in the same layout. Fills plan->load_sends,
// load_recvs and remote_load_bytes; empty lists when nothing is remote.
void BuildLoadExchange(StepPlanData* plan);
// What BuildLoadExchange fills when nothing is remote, without looking.
void ClearLoadExchange(StepPlanData* plan);

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_CORE_EXCHANGE_H_
