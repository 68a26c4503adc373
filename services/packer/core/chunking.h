// Chunked ViT forward (seed section 6): every rank's images grouped into
// chunks of at most max_patches_per_chunk patches, so one ViT forward never
// sees more patches than that. First-fit decreasing keeps the number of
// chunks (forward calls) small; an image larger than the limit is alone in
// its chunk. Items within a chunk are listed in ascending order and chunks
// are ordered by their first item.
#ifndef TUTTI_SERVICES_PACKER_CORE_CHUNKING_H_
#define TUTTI_SERVICES_PACKER_CORE_CHUNKING_H_

#include <cstdint>

#include "services/packer/core/plan_data.h"

namespace tutti::packer {

// Fills plan->chunks, rank_chunks and chunk_patches from enc_images;
// row_patches[j] is the patches of image enc_images.items[j] (the images'
// patches in row order, so that no row reads the image records).
void BuildChunks(uint64_t max_patches_per_chunk, const uint32_t* row_patches, StepPlanData* plan);

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_CORE_CHUNKING_H_
