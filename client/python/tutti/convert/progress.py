"""A progress line on stderr: redrawn in place on a terminal, a plain line every
`every` seconds otherwise (logs), nothing with mode "never"."""
import sys
import time


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class Progress:
    def __init__(self, total: int, mode: str = "auto", stream=None, every: float = 30.0):
        self.stream = stream or sys.stderr
        self.total = total
        self.enabled = mode != "never"
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.every = 0.2 if self.tty else every
        self.start = time.monotonic()
        self._last = self.start
        self._width = 0

    def update(self, done: int, skipped: int, shards: int, final: bool = False) -> None:
        now = time.monotonic()
        if not self.enabled or (not final and now - self._last < self.every):
            return
        self._last = now
        elapsed = max(now - self.start, 1e-9)
        rate = done / elapsed
        pct = 100.0 * done / self.total if self.total else 100.0
        eta = f", ETA {_duration((self.total - done) / rate)}" if rate > 0 and done < self.total else ""
        line = (f"convert: {done}/{self.total} records ({pct:.0f}%), {rate:.0f} records/s, "
                f"{shards} shards, {skipped} skipped{eta}")
        if self.tty:
            pad = " " * max(0, self._width - len(line))
            self.stream.write("\r" + line + pad + ("\n" if final else ""))
            self._width = len(line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
