"""Every kind on the device path against the host path, bit for bit: what `scripts/gpu-check.sh`
runs on a GPU.

    python python/benchmarks/check_device_kinds.py [--device cuda|cpu] [--vocab 151936]
        [--rows 1,16,64,256] [--steps 3] [--json out.json]

For each kind, its documented example (the first `{"kind": ...}` of its schema description) fills
B rows of a `Batch` on the device and of one on the host; each of `--steps` steps the same random
logits (float32, and float16 / bfloat16 at the smallest B) go through both, the device's result is
compared with the host's bit for bit, and every row's next id is the host row's greedy pick. Each
(kind, B) runs twice: with `LOGITS_PROCESSING_DEVICE` unset (the kernels where they carry the step,
the host round trip where they do not) and `=host` (the round trip for every step). Then a step
whose user processor raises must leave the device's logits as they were. On a GPU it also counts the
device path's waits a step (`_testing._device_waits`): none for a kind that reads no history and
that the kernels carry, at most one for the others (a readback of what the next step reads, or the
host round trip).

`--expect-fallback` (run with `LOGITS_PROCESSING_TEST_SELF_CHECK=fail`): the device's self-check
fails on purpose, and the package must warn once, naming it, then edit every step by the host
round trip, still equal to the host path.

`--device cpu` sends host tensors through the same device code with the package's test hook (the
round trip over host memory): what the test suite runs without a GPU. Kinds that need a tokenizer's
token texts, the model's thinking tokens or a caller's mask are listed as skipped. Exits 1 on any
difference or error.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

# Id-only forms of kinds whose documented example names texts (the kernels see only ids).
BY_IDS = {
    "dry": {"kind": "dry", "multiplier": 0.8, "allowed_length": 1, "penalty_last_n": -1, "sequence_breaker_ids": [[2]]},
    "multiple_choice": {"kind": "multiple_choice", "choices": [47, 48, 49, 0]},
}
# Kinds that need what a bare Batch has not got.
NEEDS_CONTEXT = {"bitmask": "a caller's mask", "thinking_budget": "the model's thinking tokens",
                 "hello_world": "the engine's tokenizer and EOS id"}


def examples(lp) -> dict:
    """Each kind's documented example, from the spec schema (or its id-only form)."""
    schema = json.loads(lp._lib.spec_schema())
    found = {}
    for kind in lp.kinds():
        description = schema["$defs"][kind].get("description", "")
        match = re.search(r"`(\{\"kind\": [^`]*\})`", description)
        if match:
            found[kind] = json.loads(match.group(1))
    return {**found, **BY_IDS}


def bits(tensor):
    import torch

    wide = torch.int32 if tensor.dtype == torch.float32 else torch.int16
    return tensor.contiguous().view(wide)


def first_difference(got, want):
    import torch

    differs = bits(got) != bits(want)
    if not bool(differs.any()):
        return None
    row, token = (int(i) for i in torch.nonzero(differs)[0])
    return f"row {row}, token {token}: device {float(got[row, token])!r}, host {float(want[row, token])!r}"


def run_case(lp, torch, device, spec, rows, dtype, steps, base, waits):
    """(None when every step is equal, else what differed or failed; the most waits a step made).
    Step `s`'s logits are `base`'s first rows rolled by `7 s` (random logits are drawn once: drawing
    39M a step would cost more than the check)."""
    vocab = base.shape[1]
    host, on_device = lp.Batch(vocab), lp.Batch(vocab)
    for row in range(rows):
        host.add(row, [spec], prompt_len=3)
        on_device.add(row, [spec], prompt_len=3)
    ids = [[1 + row, 7, 2] for row in range(rows)]
    most = 0
    for step in range(steps):
        logits = base[:rows].roll(7 * step, dims=1).to(dtype)
        want = logits.clone()
        host.apply(want, ids)
        got = logits.to(device)
        before = waits()
        on_device.apply(got, ids)
        most = max(most, waits() - before)
        difference = first_difference(got.cpu(), want)
        if difference:
            return f"step {step}: {difference}", most
        for row in range(rows):
            ids[row].append(int(torch.argmax(want[row].float())))
    return None, most


def failed_step_leaves_logits(lp, torch, device, vocab):
    def raising(ids, row):
        row.fill_(1e9)
        raise ValueError("raised on purpose")

    batch = lp.Batch(vocab)
    batch.add(0, [{"kind": "mirostat", "version": 2, "tau": 3.0}], prompt_len=1)
    batch.add(1, raising)
    logits = torch.randn(2, vocab, device=device)
    before = logits.clone()
    try:
        batch.apply(logits, [[5], [6]])
    except lp.ProcessorError:
        pass
    else:
        return "the raising processor's step did not fail"
    return None if torch.equal(logits, before) else "the failed step changed the logits"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--vocab", type=int, default=151_936)
    parser.add_argument("--rows", default="1,16,64,256")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--json")
    parser.add_argument("--expect-fallback", action="store_true")
    args = parser.parse_args(argv)
    os.environ.setdefault("LOGITS_PROCESSING_TEST_HOOKS", "1")
    import warnings

    import torch

    import logits_processing as lp

    if args.device == "cuda" and not torch.cuda.is_available():
        print("check_device_kinds: no CUDA device here", file=sys.stderr)
        return 1
    hook = None
    if args.device == "cpu":
        hook = getattr(getattr(lp._lib, "_testing", None), "_round_trip_host_tensors", None)
        if hook is None:
            print("check_device_kinds: --device cpu needs a build with the cuda feature", file=sys.stderr)
            return 1
        hook(True)
    waits = lp._lib._testing._device_waits
    fallback_warnings = []
    if args.expect_fallback:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            probe = lp.Batch(args.vocab)
            probe.add(0, [{"kind": "temperature", "temperature": 0.5}])
            probe.apply(torch.zeros(1, args.vocab, device=args.device), [[1]])
        fallback_warnings = [str(w.message) for w in caught if "self-check" in str(w.message)]
        if len(fallback_warnings) != 1:
            print(f"check_device_kinds: expected one warning of the failed self-check, got {fallback_warnings}")
            return 1
        print(f"check_device_kinds: {fallback_warnings[0]}")
    sizes = [int(n) for n in args.rows.split(",")]
    generator = torch.Generator().manual_seed(0)
    base = torch.randn(max(sizes), args.vocab, generator=generator) * 3
    results, bad = [], 0
    saved = os.environ.pop("LOGITS_PROCESSING_DEVICE", None)
    try:
        for kind, spec in sorted(examples(lp).items()):
            if kind in NEEDS_CONTEXT or (lp.needs_token_texts([spec]) and kind not in BY_IDS):
                why = NEEDS_CONTEXT.get(kind, "a tokenizer's token texts")
                results.append({"kind": kind, "outcome": f"skipped (needs {why})"})
                continue
            for mode in ("auto", "host"):
                os.environ["LOGITS_PROCESSING_DEVICE"] = mode
                for rows in sizes:
                    dtypes = [torch.float32] + ([torch.float16, torch.bfloat16] if rows == sizes[0] else [])
                    for dtype in dtypes:
                        most = None
                        try:
                            outcome, most = run_case(lp, torch, args.device, spec, rows, dtype, args.steps, base,
                                                     waits)
                        except Exception as error:  # noqa: BLE001 - reported, and counted as a failure
                            outcome = f"{type(error).__name__}: {error}"
                        # On a GPU with the kernels: no wait for a kind that reads no history and
                        # that they carry; one at most for the others.
                        info = lp.kind_info(kind)
                        allowed = 0 if not (info["reads_history"] or info["edits_on_host"]) else 1
                        if (outcome is None and args.device == "cuda" and mode == "auto"
                                and not args.expect_fallback and most > allowed):
                            outcome = f"{most} waits in a step (at most {allowed})"
                        bad += outcome is not None
                        results.append(
                            {
                                "kind": kind,
                                "mode": mode,
                                "rows": rows,
                                "dtype": str(dtype).removeprefix("torch."),
                                "outcome": outcome or "equal",
                                "most_waits_in_a_step": most,
                            }
                        )
                        if outcome:
                            print(f"{kind} {mode} B={rows} {dtype}: {outcome}")
        os.environ["LOGITS_PROCESSING_DEVICE"] = "auto"
        failed = failed_step_leaves_logits(lp, torch, args.device, args.vocab)
        results.append({"kind": "failed step", "outcome": failed or "logits as they were"})
        bad += failed is not None
    finally:
        os.environ.pop("LOGITS_PROCESSING_DEVICE", None)
        if saved is not None:
            os.environ["LOGITS_PROCESSING_DEVICE"] = saved
        if hook is not None:
            hook(False)
    checked = [r for r in results if "mode" in r]
    skipped = sorted(r["kind"] for r in results if r["outcome"].startswith("skipped"))
    print(
        f"check_device_kinds ({args.device}, vocab {args.vocab}, B {args.rows}, {args.steps} steps): "
        f"{len(checked) - bad} of {len(checked)} cases equal the host path bit for bit"
        f"{' (every step by the round trip: the self-check failed on purpose)' if args.expect_fallback else ''}; "
        f"failed step: {results[-1]['outcome']}; skipped: {', '.join(skipped) or 'none'}"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
