"""``TemperatureProcessor``, under the reference's module name
(``dynamo.logits_processing.examples.temperature``)."""

from .._lib import TemperatureProcessor

__all__ = ["TemperatureProcessor"]
