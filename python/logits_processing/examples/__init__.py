"""The reference's example processors: ``TemperatureProcessor``, ``ForcedSequenceLogitsProcessor``
and ``HelloWorldLogitsProcessor``, with the same names, arguments, attributes and results, and the
same submodules (``.forced_sequence``, ``.hello_world``, ``.temperature``) as
``dynamo.logits_processing.examples``."""

from .forced_sequence import ForcedSequenceLogitsProcessor
from .hello_world import RESPONSE as RESPONSE  # importable from here too
from .hello_world import HelloWorldLogitsProcessor
from .hello_world import hello_world_ids as hello_world_ids
from .temperature import TemperatureProcessor

__all__ = ["ForcedSequenceLogitsProcessor", "HelloWorldLogitsProcessor", "TemperatureProcessor"]
