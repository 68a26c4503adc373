"""Position ids of packed documents: 1-D per document and Qwen2-VL's 3-D
(M-RoPE) ids, computed as Hugging Face's Qwen2-VL get_rope_index does for
images, one document at a time (every document starts at position 0)."""
import numpy as np


def document_positions(doc_starts, doc_lengths, total):
    """[total] int64: 0..len-1 within each document."""
    if total == 0:
        return np.zeros(0, np.int64)
    starts = np.repeat(np.asarray(doc_starts, np.int64), np.asarray(doc_lengths, np.int64))
    return np.arange(total, dtype=np.int64) - starts


def mrope_positions(length, images, merge_size):
    """[3, length] int64 M-RoPE ids of one document.

    images: (first image-token position within the document, (t, h, w) grid
    in ViT patches) per image, in order. Text runs count up on all three axes
    from one past the largest id before them; an image's tokens take
    (t, h, w) indices of its merged grid, offset by the position where the
    image starts."""
    out = np.empty((3, length), np.int64)
    cursor = 0  # next token to place
    next_id = 0  # first id of the next run
    for start, (t, h, w) in images:
        lh, lw = h // merge_size, w // merge_size
        n = t * lh * lw
        text = start - cursor
        out[:, cursor:start] = next_id + np.arange(text, dtype=np.int64)
        base = next_id + text
        out[0, start:start + n] = base + np.repeat(np.arange(t, dtype=np.int64), lh * lw)
        out[1, start:start + n] = base + np.tile(np.repeat(np.arange(lh, dtype=np.int64), lw), t)
        out[2, start:start + n] = base + np.tile(np.arange(lw, dtype=np.int64), t * lh)
        next_id = base + max(t, lh, lw)
        cursor = start + n
    out[:, cursor:length] = next_id + np.arange(length - cursor, dtype=np.int64)
    return out
