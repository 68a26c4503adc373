"""Independent references for the tests: what HF's code computes, written as it reads."""
import numpy as np


def hf_style_rope(tokens, grids, merge, image_token):
    """Qwen2-VL get_rope_index for one unpadded row of images, written as its loop reads:
    find each image's first token, text before it counts on, then the grid indices."""
    pos, st, image = [], 0, 0
    while image < len(grids):
        ed = tokens.index(image_token, st)
        t, h, w = grids[image]
        lt, lh, lw = t, h // merge, w // merge
        start = (max(max(p) for p in pos) + 1) if pos else 0
        text = ed - st
        pos += [[start + i] * 3 for i in range(text)]
        for a in range(lt):
            for b in range(lh):
                for c in range(lw):
                    pos.append([start + text + a, start + text + b, start + text + c])
        st = ed + lt * lh * lw
        image += 1
    start = (max(max(p) for p in pos) + 1) if pos else 0
    pos += [[start + i] * 3 for i in range(len(tokens) - st)]
    return np.array(pos, np.int64).T
