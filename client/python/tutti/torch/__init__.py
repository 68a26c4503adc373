"""tutti for PyTorch trainers.

    import tutti.torch
    tutti.torch.init_process_group()            # torchrun, mpirun or srun
    loader = tutti.torch.Loader()               # the node's stager, the job's packer
    for batch in loader:                        # one per step; the previous one is released
        x = vit(batch.pixel_values, batch.vit_cu_seqlens)    # this rank's images
        emb = tutti.torch.exchange(x, batch)    # to the ranks whose documents hold them
        for mb in batch.micro_batches:          # gradient accumulation
            h = mb.scatter_image_embeds(llm.embed(mb.input_ids), emb)
            loss = llm(h, mb.mrope_position_ids, mb.cu_seqlens, mb.labels)
            loss.backward()                     # the last one runs the backward exchange
        optimizer.step()

See client/README.md for every field, its shape, dtype and meaning.
"""
from tutti.torch._batch import Batch, LabelOptions, MicroBatch
from tutti.torch._env import LaunchEnv, init_process_group, launch_env
from tutti.torch._exchange import exchange, share_skipped_images
from tutti.torch._loader import Loader

__all__ = ["Batch", "LabelOptions", "LaunchEnv", "Loader", "MicroBatch", "exchange",
           "init_process_group", "launch_env", "share_skipped_images"]
