"""``ForcedSequenceLogitsProcessor``, under the reference's module name
(``dynamo.logits_processing.examples.forced_sequence``)."""

from .._lib import ForcedSequenceLogitsProcessor

__all__ = ["ForcedSequenceLogitsProcessor"]
