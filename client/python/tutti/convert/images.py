"""Image members: read an ImageRef's bytes, check them as the stager will, name the format.

The header is read as `tutti index` and the stager read it (common/media_header.cc): the
format from the magic bytes, the size from the JPEG frame header, the PNG IHDR chunk or
the WebP VP8/VP8L/VP8X chunk; what they refuse is refused here, so the converter never
writes a sample the index then leaves out. --verify-images decode also decodes every
pixel (Pillow), which catches a file cut short after its header. The limits match
`tutti index`'s defaults. The stored member is the source file's bytes, unchanged; its
extension comes from the bytes (a PNG named .jpg is stored as k.N.png).
"""
import io
import struct
from dataclasses import dataclass

from .records import ImageRef, Skip

EXTENSIONS = {"jpeg": "jpg", "png": "png", "webp": "webp"}
_PNG = b"\x89PNG\r\n\x1a\n"


@dataclass
class ImageLimits:
    max_side: int = 65500              # pixels on either side (index: --max-source-side)
    max_pixels: int = 178956970        # width x height (index: --max-source-pixels)
    max_aspect_ratio: float = 200.0    # long side / short side (smart resize refuses more)
    verify: str = "header"             # header: read the header; decode: decode every pixel


@dataclass
class Image:
    data: bytes
    ext: str
    width: int
    height: int


class HeaderError(Exception):
    pass


def _jpeg(p: bytes):
    i, n = 2, len(p)
    while i + 4 <= n:
        if p[i] != 0xFF:
            raise HeaderError(f"JPEG marker expected at byte {i}")
        while i < n and p[i] == 0xFF:
            i += 1
        if i >= n:
            break
        marker = p[i]
        i += 1
        if marker == 0xD8 or 0xD0 <= marker <= 0xD7 or marker == 0x01:
            continue
        if marker in (0xD9, 0xDA):
            raise HeaderError("JPEG has no frame header before its scan data")
        if i + 2 > n:
            break
        length = (p[i] << 8) | p[i + 1]
        if length < 2:
            raise HeaderError("JPEG segment with length < 2")
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            if i + 7 > n:
                break
            height, width = struct.unpack_from(">HH", p, i + 3)
            if not width or not height:
                raise HeaderError("JPEG frame header declares an empty image")
            return width, height
        i += length
    raise HeaderError("JPEG header truncated before its frame header")


def _png(p: bytes):
    if len(p) < 24:
        raise HeaderError("PNG truncated before IHDR")
    if p[12:16] != b"IHDR":
        raise HeaderError("PNG does not start with an IHDR chunk")
    width, height = struct.unpack_from(">II", p, 16)
    if not width or not height or width > 0x7FFFFFFF or height > 0x7FFFFFFF:
        raise HeaderError(f"PNG IHDR declares invalid size {width}x{height}")
    return width, height


def _webp(p: bytes):
    if len(p) < 30:
        raise HeaderError("WebP truncated before its first chunk")
    fourcc, c = p[12:16], 20
    if fourcc == b"VP8 ":
        if p[c + 3:c + 6] != b"\x9d\x01\x2a":
            raise HeaderError("WebP VP8 chunk has a bad start code")
        width, height = (v & 0x3FFF for v in struct.unpack_from("<HH", p, c + 6))
    elif fourcc == b"VP8L":
        if p[c] != 0x2F:
            raise HeaderError("WebP VP8L chunk has a bad signature")
        bits = struct.unpack_from("<I", p, c + 1)[0]
        width, height = (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    elif fourcc == b"VP8X":
        width = int.from_bytes(p[c + 4:c + 7], "little") + 1
        height = int.from_bytes(p[c + 7:c + 10], "little") + 1
    else:
        raise HeaderError(f"WebP has unknown first chunk {fourcc!r}")
    return width, height


def read_header(data: bytes):
    """(format, width, height) as common/media_header.cc reads them; HeaderError if not."""
    if not data:
        raise HeaderError("image is empty (0 bytes)")
    if data[:3] == b"\xff\xd8\xff":
        return ("jpeg", *_jpeg(data))
    if data[:8] == _PNG:
        return ("png", *_png(data))
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return ("webp", *_webp(data))
    raise HeaderError("not a JPEG, PNG or WebP image (unknown magic bytes)")


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


def _check_with_pillow(data: bytes, kind: str, width: int, height: int, decode: bool) -> None:
    """Pillow reads the bytes as the header says (for WebP: libwebp reads the bitstream
    header, as the stager's check does); with decode, every pixel too."""
    from PIL import Image as PilImage

    PilImage.MAX_IMAGE_PIXELS = None  # the limits are the converter's, with reasons
    with PilImage.open(io.BytesIO(data), formats=[kind.upper()]) as im:
        if im.size != (width, height):
            raise HeaderError(f"the header says {width}x{height}, the bitstream {im.size[0]}x{im.size[1]}")
        if decode:
            im.load()


def load(ref: ImageRef, limits: ImageLimits) -> Image:
    data = read(ref)
    try:
        kind, width, height = read_header(data)
        if limits.verify == "decode" or kind == "webp":
            _check_with_pillow(data, kind, width, height, limits.verify == "decode")
    except Exception as e:  # Pillow raises many types for corrupt data; none may stop a run
        raise Skip("bad_image", f"{ref.describe()}: not a readable image ({e})") from None
    if max(width, height) > limits.max_side or width * height > limits.max_pixels:
        raise Skip("image_too_large", f"{ref.describe()}: {width}x{height} is over the limit "
                   f"(--max-image-side {limits.max_side}, --max-image-pixels {limits.max_pixels})")
    if max(width, height) > limits.max_aspect_ratio * min(width, height):
        raise Skip("aspect_ratio", f"{ref.describe()}: {width}x{height} has an aspect ratio over "
                   f"{limits.max_aspect_ratio:g} (--max-aspect-ratio)")
    return Image(data, EXTENSIONS[kind], width, height)
