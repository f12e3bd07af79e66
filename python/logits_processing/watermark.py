"""transformers' ``WatermarkDetector`` for text watermarked by the kind ``watermark`` (or by
transformers' ``WatermarkLogitsProcessor`` on the CPU): the core's detector, the output's fields.
"""

from dataclasses import dataclass
from typing import Any, List, Optional, Union

from . import _lib


@dataclass(frozen=True)
class WatermarkDetectorOutput:
    """transformers' ``WatermarkDetectorOutput``: for one text each field is a number (a bool
    for ``prediction``); for a batch, a list with one per text.

    Example:
        >>> from logits_processing import detect_watermark
        >>> out = detect_watermark([[5, 9, 13, 2], [7, 7, 1, 3]], vocab_size=32)
        >>> out.num_tokens_scored
        [3, 3]
        >>> [type(p) for p in out.prediction]
        [<class 'bool'>, <class 'bool'>]
    """

    num_tokens_scored: Union[int, List[int]]
    num_green_tokens: Union[int, List[int]]
    green_fraction: Union[float, List[float]]
    z_score: Union[float, List[float]]
    p_value: Union[float, List[float]]
    prediction: Union[bool, List[bool]]
    confidence: Union[float, List[float]]


def detect_watermark(
    input_ids: Any,
    *,
    vocab_size: int,
    greenlist_ratio: float = 0.25,
    bias: float = 2.0,
    hashing_key: int = 15485863,
    seeding_scheme: str = "lefthash",
    context_width: int = 1,
    ignore_repeated_ngrams: bool = False,
    z_threshold: float = 3.0,
    bos_token_id: Optional[int] = None,
) -> WatermarkDetectorOutput:
    """Whether texts carry the watermark, as transformers' ``WatermarkDetector`` says.

    Each n-gram (``context_width + 1`` ids, ``context_width`` with ``"selfhash"``) scores its
    last id green or not under the green list its ids seed; ``z_score`` is the green count's
    distance from ``greenlist_ratio`` in standard deviations, ``prediction`` is
    ``z_score > z_threshold``.

    Args:
        input_ids: one text (a list of ids, a 1-D tensor or array) or a batch (a list of lists,
            a 2-D tensor). Leave the prompt out, as transformers advises.
        vocab_size: the model's vocab size (``model.config.vocab_size``).
        greenlist_ratio, bias, hashing_key, seeding_scheme, context_width: the watermark's
            settings (``**WatermarkingConfig(...).to_dict()`` passes them).
        ignore_repeated_ngrams: count each distinct n-gram once.
        z_threshold: the verdict's threshold (transformers' default 3.0).
        bos_token_id: the model's BOS id: a leading one is not scored (in a batch, all texts
            must start with it or none).

    Returns:
        A :class:`WatermarkDetectorOutput`: numbers for one text, lists for a batch.

    Raises:
        SpecError / InvalidArgumentError: a setting out of range, a text with no n-gram to
            score, a batch mixing texts with and without the BOS id; naming the field.

    Example:
        >>> from logits_processing import detect_watermark
        >>> out = detect_watermark([5, 9, 13, 2, 7, 7, 1], vocab_size=32)
        >>> out.num_tokens_scored
        6
        >>> out.prediction
        False
    """
    rows = input_ids.tolist() if hasattr(input_ids, "tolist") else input_ids
    batched = isinstance(rows, (list, tuple)) and len(rows) > 0 and not isinstance(rows[0], int)
    verdicts = _lib.detect_watermark(
        rows if batched else [rows],
        vocab_size=vocab_size,
        greenlist_ratio=greenlist_ratio,
        bias=bias,
        hashing_key=hashing_key,
        seeding_scheme=seeding_scheme,
        context_width=context_width,
        ignore_repeated_ngrams=ignore_repeated_ngrams,
        z_threshold=z_threshold,
        bos_token_id=bos_token_id,
    )
    fields = list(zip(*verdicts)) if verdicts else [[] for _ in range(7)]
    if not batched:
        fields = [f[0] for f in fields]
    else:
        fields = [list(f) for f in fields]
    return WatermarkDetectorOutput(*fields)
