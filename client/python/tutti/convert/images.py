"""Image members: read an ImageRef's bytes, check them as the stager will, name the format.

The stored member is the source file's bytes, unchanged; its extension comes from the
bytes (a PNG named .jpg is stored as k.N.png). The limits match `tutti index`'s defaults,
so a sample the converter writes is not one the index then leaves out.
"""
import io
from dataclasses import dataclass

from .records import ImageRef, Skip

EXTENSIONS = {"JPEG": "jpg", "PNG": "png", "WEBP": "webp"}  # what the stager decodes


@dataclass
class ImageLimits:
    max_side: int = 65500              # pixels on either side (index: --max-source-side)
    max_pixels: int = 178956970        # width x height (index: --max-source-pixels)
    max_aspect_ratio: float = 200.0    # long side / short side (smart resize refuses more)
    verify: str = "header"             # header: parse the header; decode: decode every pixel


@dataclass
class Image:
    data: bytes
    ext: str
    width: int
    height: int


def read(ref: ImageRef) -> bytes:
    if ref.data is not None:
        return ref.data
    if ref.path is None:
        raise Skip("missing_image", f"{ref.describe()}: only local files and data: URLs are "
                   "read; download remote images first")
    try:
        with open(ref.path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise Skip("missing_image", f"{ref.path}: no such file (check --image-root)") from None
    except OSError as e:
        raise Skip("missing_image", f"{ref.path}: cannot read: {e.strerror or e}") from None


def load(ref: ImageRef, limits: ImageLimits) -> Image:
    data = read(ref)
    from PIL import Image as PilImage

    PilImage.MAX_IMAGE_PIXELS = None  # the limits below are the converter's, with reasons
    try:
        with PilImage.open(io.BytesIO(data)) as im:
            fmt, (width, height) = im.format, im.size
            if limits.verify == "decode":
                im.load()
    except Exception as e:  # PIL raises many types for corrupt data; none may stop a run
        raise Skip("bad_image", f"{ref.describe()}: not a readable image ({e})") from None
    ext = EXTENSIONS.get(fmt)
    if ext is None:
        raise Skip("bad_image", f"{ref.describe()}: {fmt} is not served (JPEG, PNG and WebP "
                   "are); convert it first")
    if max(width, height) > limits.max_side or width * height > limits.max_pixels:
        raise Skip("image_too_large", f"{ref.describe()}: {width}x{height} is over the limit "
                   f"(--max-image-side {limits.max_side}, --max-image-pixels {limits.max_pixels})")
    if max(width, height) > limits.max_aspect_ratio * min(width, height):
        raise Skip("aspect_ratio", f"{ref.describe()}: {width}x{height} has an aspect ratio over "
                   f"{limits.max_aspect_ratio:g} (--max-aspect-ratio)")
    return Image(data, ext, width, height)
