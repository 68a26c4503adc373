// Exchange lists: the all-to-all that carries every encoder output from the
// rank that encoded it to the rank whose LLM phase consumes it.
//
// For rank r, sends are its encoder items grouped by destination rank
// (ascending), recvs the items its LLM phase needs grouped by source rank,
// so both ends agree on the buffer layout. Transfers to the rank itself are
// listed too. Bytes between ranks of different nodes (node = rank /
// ranks_per_node) count as inter-node.
//
// When every item stays on its rank (no post-balancing), a pair's items are
// in batch order (images, then audio clips). Otherwise the lists are laid
// out so that a pair's items move in few messages (Transfer.runs): each
// sequence's documents are ordered by the rank that encodes their first
// item (alternately ascending and descending from one sequence to the next,
// so that neighbouring sequences' groups from one rank meet), a pair's
// items follow the LLM rank's input_ids order (out_pos), and each rank's
// encoder images and audio clips follow its sends. A run of a pair's items
// with consecutive out_pos is then adjacent at both ends.
#ifndef TUTTI_SERVICES_PACKER_CORE_EXCHANGE_H_
#define TUTTI_SERVICES_PACKER_CORE_EXCHANGE_H_

#include "services/packer/core/plan_data.h"

namespace tutti::packer {

// Fills plan->sends, recvs, out_pos, inter_node_bytes and intra_node_bytes;
// with items that move, reorders plan->docs within each sequence and the
// rows of enc_images and enc_audio (chunks must be built after it).
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
