"""What a pipeline does to one row, step by step: ``logits-processing explain``.

Each prefix of the spec list runs through the library (:class:`Processor`) on a copy of the row;
each step reports the tokens kept, the top tokens' probabilities before and after it, and the
entropy. The row is a synthetic one of a named shape (:func:`synthetic_row`), a logits file
(:func:`row_from_file`), or the next-token logits of a prompt through a local transformers model
(:func:`row_from_model`); a tokenizer names the tokens (:func:`token_labels`). :func:`figure`
draws the top tokens' probability after each step, side by side, with matplotlib (the
``explain`` extra); :func:`html` puts that picture and the table in one page. Needs numpy.
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


def row_from_file(path: str):
    """A float32 row from ``path``: a ``.npy`` array, else text (a JSON list, or numbers separated
    by whitespace or commas). A 2-D array must hold one row."""
    import numpy as np

    if str(path).endswith(".npy"):
        row = np.load(path, allow_pickle=False)
    else:
        with open(path, encoding="utf-8") as f:
            text = f.read().strip()
        values = json.loads(text) if text.startswith("[") else text.replace(",", " ").split()
        row = np.asarray(values, dtype=np.float32)
    row = np.asarray(row, dtype=np.float32)
    if row.ndim == 2 and row.shape[0] == 1:
        row = row[0]
    if row.ndim != 1 or row.size == 0:
        raise ValueError(f"{path}: expected one row of logits, found shape {list(row.shape)}")
    return row


def row_from_model(model: str, prompt: str, tokenizer: Any = None):
    """The next-token logits of ``prompt`` through the transformers model in directory ``model``
    (its own tokenizer unless one is given), as ``(row, prompt_ids)``. Needs torch and
    transformers; loads nothing from a hub."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = tokenizer or AutoTokenizer.from_pretrained(model, local_files_only=True)
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    net = AutoModelForCausalLM.from_pretrained(model, local_files_only=True).eval()
    with torch.no_grad():
        logits = net(torch.tensor([ids])).logits[0, -1]
    return logits.float().numpy().astype(np.float32), ids


def _tokenizer_file(path) -> str:
    """A ``tokenizer.json`` path, or the one in directory ``path``."""
    import os

    return os.path.join(path, "tokenizer.json") if os.path.isdir(path) else str(path)


def token_labels(tokenizer: Any):
    """``id -> text`` for the picture and the table: from a ``tokenizers.Tokenizer``, a transformers
    tokenizer, or the path of a ``tokenizer.json`` (or of a directory holding one)."""
    import os

    if isinstance(tokenizer, (str, os.PathLike)):
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(_tokenizer_file(tokenizer))

    def label(token: int) -> str:
        return repr(tokenizer.decode([token]))

    return label


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


def table(steps: list[Step], labels=None) -> str:
    """The steps as text: for each, the tokens kept, the entropy, and the top tokens' probability
    before and after it (``labels(id)``, the token's text, beside its id)."""
    out = []
    for k, s in enumerate(steps):
        out.append(f"step {k}: {s.label}: kept {s.kept}, entropy {s.entropy_bits:.4f} bits")
        for t in s.top:
            before = f"{steps[k - 1].probs[t]:.6f} -> " if k else ""
            name = f" {labels(t)}" if labels else ""
            out.append(f"    {t:>8}{name}  {before}{s.probs[t]:.6f}")
    return "\n".join(out)


def html(steps: list[Step], labels=None) -> str:
    """One self-contained HTML page: :func:`figure` as inline SVG, then each step's numbers in a
    table (the tokens' texts escaped)."""
    import io
    from html import escape

    svg = io.StringIO()
    figure(steps, labels).savefig(svg, format="svg")
    picture = svg.getvalue()
    picture = picture[picture.index("<svg"):]  # without the XML prologue, to sit inside the page
    sections = []
    for k, s in enumerate(steps):
        rows = "".join(
            f"<tr><td>{t}</td><td>{escape(labels(t)) if labels else ''}</td>"
            f"<td>{f'{steps[k - 1].probs[t]:.6f}' if k else ''}</td><td>{s.probs[t]:.6f}</td></tr>"
            for t in s.top
        )
        sections.append(
            f"<h2>step {k}: {escape(s.label)}</h2><p>kept {s.kept}, entropy {s.entropy_bits:.4f} bits</p>"
            f"<table><tr><th>id</th><th>text</th><th>before</th><th>after</th></tr>{rows}</table>"
        )
    return (
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>logits-processing explain</title>"
        "<style>body{font-family:sans-serif}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}</style></head><body>"
        f"<h1>What the pipeline does to the row</h1>{picture}{''.join(sections)}</body></html>\n"
    )


def add_parser(sub) -> None:
    from .cli import count

    e = sub.add_parser("explain", help="what a pipeline does to a row, step by step")
    e.add_argument("specs", help="inline JSON or a file")
    e.add_argument("--shape", choices=SHAPES, default="zipf", help="the synthetic row (default zipf)")
    e.add_argument("--vocab", type=count(1), default=1000, help="the synthetic row's length")
    e.add_argument("--row", metavar="PATH", help="a logits file (.npy, a JSON list, or numbers) instead")
    e.add_argument("--model", metavar="DIR", help="a local transformers model: the row is --prompt's next-token logits")
    e.add_argument("--prompt", help="the text --model reads")
    e.add_argument("--tokenizer", metavar="PATH", help="a tokenizer.json (or a directory with one): tokens as text")
    e.add_argument("--top", type=count(1), default=10)
    e.add_argument("--png", metavar="PATH", help="draw the steps (needs matplotlib)")
    e.add_argument("--html", metavar="PATH", help="the picture and the table in one page (needs matplotlib)")
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
    if (args.model is None) != (args.prompt is None):
        raise UsageError("--model and --prompt go together")
    if args.model is not None and args.row is not None:
        raise UsageError("--row or --model, not both")
    labels, tokenizer = None, None
    if args.tokenizer is not None:
        try:
            labels = token_labels(args.tokenizer)
        except Exception as e:  # noqa: BLE001 - any failure to load is bad input, said in one line
            raise UsageError(f"--tokenizer {args.tokenizer}: {e}") from None
    ids: Any = ()
    if args.row is not None:
        try:
            row = row_from_file(args.row)
        except (OSError, UnicodeDecodeError, ValueError) as e:
            raise UsageError(f"--row {args.row}: {e}") from None
    elif args.model is not None:
        try:
            if args.tokenizer is not None:
                from transformers import PreTrainedTokenizerFast

                tokenizer = PreTrainedTokenizerFast(tokenizer_file=_tokenizer_file(args.tokenizer))
            row, ids = row_from_model(args.model, args.prompt, tokenizer)
        except ImportError as e:
            raise UsageError(f"--model needs torch and transformers: {e}") from None
        except (OSError, ValueError) as e:
            raise UsageError(f"--model {args.model}: {e}") from None
        if labels is None:
            from transformers import AutoTokenizer

            labels = token_labels(AutoTokenizer.from_pretrained(args.model, local_files_only=True))
    else:
        row = synthetic_row(args.shape, args.vocab)
    steps = explain(text, row, input_ids=ids, prompt_len=len(ids), top=args.top)
    print(table(steps, labels))
    try:
        if args.png:
            figure(steps, labels).savefig(args.png)
        if args.html:
            with open(args.html, "w", encoding="utf-8") as f:
                f.write(html(steps, labels))
    except ImportError as e:
        print(f"logits-processing explain: {e}", file=sys.stderr)
        return 2
    return 0
