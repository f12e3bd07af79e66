"""What a pipeline does to one row, step by step: ``logits-processing explain``.

Each prefix of the spec list runs through the library (:class:`Processor`) on a copy of the row;
each step reports the tokens kept, the top tokens' probabilities before and after it, and the
entropy. :func:`figure` draws the top tokens' probability after each step, side by side, with
matplotlib (the ``explain`` extra). Needs numpy.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

SHAPES = ("flat", "peaked", "zipf")


@dataclass
class Step:
    label: str
    probs: Any  # float64 numpy array, 0 where a token was removed
    kept: int
    entropy_bits: float
    top: list = field(default_factory=list)  # token ids, most probable first


def synthetic_row(shape: str = "zipf", vocab: int = 1000, seed: int = 0):
    """A float32 row: ``flat`` N(0, 1), ``peaked`` (N(0, 1) with five tokens far above), ``zipf``
    (probability 1/rank over a shuffled vocab)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    if shape == "flat":
        return rng.standard_normal(vocab).astype(np.float32)
    if shape == "peaked":
        row = rng.standard_normal(vocab).astype(np.float32)
        row[rng.choice(vocab, 5, replace=False)] += np.array([9, 8, 7, 6, 5], np.float32)
        return row
    if shape == "zipf":
        return (-np.log1p(rng.permutation(vocab))).astype(np.float32)
    raise ValueError(f"shape: {shape!r} is not one of {', '.join(SHAPES)}")


def _probs(row):
    import numpy as np

    x = row.astype(np.float64)
    finite = np.isfinite(x)
    p = np.zeros_like(x)
    if finite.any():
        e = np.exp(x[finite] - x[finite].max())
        p[finite] = e / e.sum()
    return p


def _step(label, row, top):
    import numpy as np

    p = _probs(row)
    nz = p[p > 0]
    order = np.argsort(-p, kind="stable")[:top]
    return Step(label, p, int(np.isfinite(row).sum()), float(-(nz * np.log2(nz)).sum()),
                [int(i) for i in order if p[i] > 0])


def explain(specs, row=None, *, input_ids=(), prompt_len: int = 0, top: int = 10, context=None) -> list[Step]:
    """Step 0 is the row as given, step k the row after the first k specs."""
    import numpy as np

    from . import Processor

    if isinstance(specs, str):
        specs = json.loads(specs)
    if isinstance(specs, dict):
        specs = [specs]
    row = synthetic_row() if row is None else np.asarray(row, dtype=np.float32)
    steps = [_step("input", row, top)]
    for k in range(1, len(specs) + 1):
        x = row.copy()
        Processor(specs[:k], prompt_len=prompt_len, context=context)(np.asarray(input_ids, np.int64), x)
        spec = specs[k - 1]
        args = " ".join(f"{a}={json.dumps(v)}" for a, v in spec.items() if a != "kind")
        steps.append(_step(f"{spec['kind']} {args}".strip(), x, top))
    return steps


def figure(steps: list[Step], labels=None):
    """A matplotlib Figure: one panel per step, side by side, bars of the top tokens' probability
    after that step (the tokens of every step's top, in the input's order). ``labels(id)`` names a
    token (default: its id)."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError("explain's pictures need matplotlib: pip install 'logits-processing[explain]'") from None
    tokens = []
    for s in steps:
        tokens += [t for t in s.top if t not in tokens]
    tokens.sort(key=lambda t: -steps[0].probs[t])
    names = [labels(t) if labels else str(t) for t in tokens]
    fig = Figure(figsize=(2.6 * len(steps), 0.3 * len(tokens) + 1.2), layout="constrained")
    axes = fig.subplots(1, len(steps), sharey=True, squeeze=False)[0]
    for ax, s in zip(axes, steps):
        ax.barh(range(len(tokens)), [s.probs[t] for t in tokens], color="tab:blue")
        ax.set_yticks(range(len(tokens)), names)
        ax.invert_yaxis()
        ax.set_xlim(0, 1)
        ax.set_title(f"{s.label}\nkept {s.kept}, H {s.entropy_bits:.2f} bits", fontsize=8)
    return fig


def table(steps: list[Step]) -> str:
    """The steps as text: for each, the tokens kept, the entropy, and the top tokens' probability
    before and after it."""
    out = []
    for k, s in enumerate(steps):
        out.append(f"step {k}: {s.label}: kept {s.kept}, entropy {s.entropy_bits:.4f} bits")
        for t in s.top:
            before = f"{steps[k - 1].probs[t]:.6f} -> " if k else ""
            out.append(f"    {t:>8}  {before}{s.probs[t]:.6f}")
    return "\n".join(out)


def add_parser(sub) -> None:
    from .cli import count

    e = sub.add_parser("explain", help="what a pipeline does to a row, step by step")
    e.add_argument("specs", help="inline JSON or a file")
    e.add_argument("--shape", choices=SHAPES, default="zipf", help="the synthetic row (default zipf)")
    e.add_argument("--vocab", type=count(1), default=1000)
    e.add_argument("--top", type=count(1), default=10)
    e.add_argument("--png", metavar="PATH")
    e.set_defaults(run=_run)


def _run(args) -> int:
    import sys

    from .cli import UsageError

    text = args.specs
    if text.lstrip()[:1] not in "[{":
        try:
            text = open(args.specs, encoding="utf-8").read()
        except (OSError, UnicodeDecodeError) as e:
            raise UsageError(f"{args.specs}: {e}") from None
    steps = explain(text, synthetic_row(args.shape, args.vocab), top=args.top)
    print(table(steps))
    if args.png:
        try:
            figure(steps).savefig(args.png)
        except ImportError as e:
            print(f"logits-processing explain: {e}", file=sys.stderr)
            return 2
    return 0
