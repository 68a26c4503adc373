"""tutti.convert: conversation and caption records -> tutti shards (sample schema 2).

The command line is `tutti convert` (python3 -m tutti.convert); README.md beside this file
documents the schema and the options. From Python:

    from tutti.convert import ConvertOptions, run
    report = run(ConvertOptions(inputs=["llava.jsonl"], out="shards", tokenizer="tok.model"))

A pure-data tool: nothing here needs the compiled extension tutti._tutti.
"""
from .driver import ConvertError, ConvertOptions, Report, run  # noqa: F401
from .formats import FormatOptions  # noqa: F401
from .images import ImageLimits  # noqa: F401
from .records import REASONS  # noqa: F401
from .sample import Limits  # noqa: F401
