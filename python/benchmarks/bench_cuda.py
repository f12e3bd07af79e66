"""GPU benchmark: one decode step of a mixed batch on CUDA logits, four ways, in one run.

    python python/benchmarks/bench_cuda.py [--quick] [--sizes 1,16,64,256] [--json out.json]

Vocab 151,936, float32, B = 1, 16, 64, 256; the mixed batch of bench_cpu.py (a third forced
sequences, a third temperature 0.7, a third thinking budget over its budget; 4,000-id histories).
Per decode step, medians of CUDA-event times over back-to-back steps (so host time shows where the
host is the bottleneck):

- ours: `logits_processing.Batch.apply` on the CUDA tensor (plans on the host, one kernel launch
  on torch's current stream);
- the reference's per-request loop: dynamo.logits_processing's example processors, and its thinking
  budget rule written out in torch (reference_rules.py), one call per row;
- hand-vectorized torch: the same edits as a few batched kernels (divide, fill, scatter), with the
  per-row decisions precomputed (not counted: a lower bound for that approach);
- the floor: a device-to-device copy of the block (read + write every logit once).

Exits with a message (status 0, or 1 with --require-gpu) where torch sees no GPU or this build of
logits_processing has no CUDA support.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from reference_rules import RefThinkingBudget  # beside this script

VOCAB = 151_936
START, END, NEWLINE, WORD = 151_667, 151_668, 198, 1000
FORCED = list(range(100, 200))
HISTORY_LEN = 4_000
BUDGET = 100


def no_gpu(message: str, require: bool) -> None:
    print(f"bench_cuda: SKIPPED: {message}")
    raise SystemExit(1 if require else 0)


def reference():
    """The reference's processors, or None (after saying so) where it is not installed."""
    try:
        from dynamo.logits_processing import examples
    except ImportError:
        print("note: dynamo.logits_processing (ai-dynamo-runtime 1.6.1) is not importable")
        return None
    return Reference(examples.ForcedSequenceLogitsProcessor, examples.TemperatureProcessor)


class Reference:
    """The reference's processor classes."""

    def __init__(self, forced, temperature):
        self.RefForced, self.RefTemperature = forced, temperature


def gpu_us(torch, fn, data, master, calls, blocks, warmup=2):
    """Median over `blocks` of CUDA-event time per step for `calls` back-to-back steps (wall-clock
    time for --cpu-smoke)."""
    for _ in range(warmup):
        fn()
    cuda = data.is_cuda
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(blocks):
        data.copy_(master)
        if cuda:
            torch.cuda.synchronize()
            start.record()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        if cuda:
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1000.0 / calls)
        else:
            times.append((time.perf_counter() - t0) * 1e6 / calls)
    return statistics.median(times)


def build(torch, lp, ref, rows, device):
    """Our batch, the reference processors, and the vectorized version's precomputed decisions."""
    batch = lp.Batch(VOCAB, context=lp.EngineContext(thinking_tokens=lp.ThinkingTokenConfig(START, END, NEWLINE)))
    refs = []
    scale = torch.ones(rows, 1, dtype=torch.float32)
    forced_rows, forced_tokens, set_zero = [], [], []
    for row in range(rows):
        kind = row % 3
        if kind == 0:
            batch.add(row, {"kind": "forced_sequence", "token_ids": FORCED, "eos_token_id": 2})
            refs.append(ref.RefForced(FORCED, 2) if ref else None)
            forced_rows.append(row)
            forced_tokens.append(FORCED[0])
            set_zero.append(False)
        elif kind == 1:
            batch.add(row, {"kind": "temperature", "temperature": 0.7})
            refs.append(ref.RefTemperature(0.7) if ref else None)
            scale[row] = 0.7
        else:
            batch.add(row, {"kind": "thinking_budget", "max_thinking_tokens": BUDGET})
            refs.append(RefThinkingBudget(START, END, NEWLINE, BUDGET))
            forced_rows.append(row)
            forced_tokens.append(END)
            set_zero.append(True)
    dev = torch.device(device)
    decisions = {
        "scale": scale.to(dev),
        "rows": torch.tensor(forced_rows, dtype=torch.long, device=dev),
        "tokens": torch.tensor(forced_tokens, dtype=torch.long, device=dev),
        "set_zero": torch.tensor(set_zero, dtype=torch.bool, device=dev),
    }
    return batch, refs, decisions


def vectorized_step(torch, data, d):
    """The mixed batch's edits as batched torch kernels (decisions precomputed): one division of
    the block (1.0 on rows without a temperature), the forced rows' survivors gathered, the forced
    rows filled with -inf, the survivors written back."""
    data.div_(d["scale"])
    rows, tokens = d["rows"], d["tokens"]
    if rows.numel():
        kept = data[rows, tokens]
        data.index_fill_(0, rows, float("-inf"))
        data[rows, tokens] = torch.where(d["set_zero"], torch.zeros_like(kept), kept + 0.0)


def bench_size(torch, lp, ref, rows, calls, blocks, device="cuda"):
    """One batch size: a correctness check, then the four timings."""
    torch.manual_seed(rows)
    master = (torch.randn(rows, VOCAB, device=device) * 8).to(torch.float32)
    data = master.clone()
    dst = torch.empty_like(master)
    batch, refs, decisions = build(torch, lp, ref, rows, device)
    history = [START] + [WORD] * (HISTORY_LEN - 1)  # thinking past its budget
    ids = [history] * rows

    # Same answers first: ours on the GPU against ours on the CPU, bit for bit.
    gpu = master.clone()
    cpu = master.cpu().clone()  # (a copy even when master is on the CPU: --cpu-smoke)
    batch.apply(gpu, ids)
    batch_cpu, _, _ = build(torch, lp, ref, rows, "cpu")
    batch_cpu.apply(cpu, ids)
    if device == "cuda":
        torch.cuda.synchronize()
    same = torch.equal(gpu.cpu().view(torch.int32), cpu.view(torch.int32))

    # The other two give the same answers (a check of this benchmark, not of the crate).
    vec_once = master.clone()
    vectorized_step(torch, vec_once, decisions)
    agree = {"vectorized_equals_ours": bool(torch.equal(vec_once, gpu))}
    if ref is not None:
        ref_once = master.clone()
        for row in range(rows):
            refs[row](ids[row], ref_once[row])
        agree["reference_equals_ours"] = bool(torch.equal(ref_once, gpu))

    ours = gpu_us(torch, lambda: batch.apply(data, ids), data, master, calls, blocks)
    floor = gpu_us(torch, lambda: dst.copy_(data), data, master, calls, blocks)
    vec = gpu_us(torch, lambda: vectorized_step(torch, data, decisions), data, master, calls, blocks)
    reference = float("nan")
    if ref is not None:

        def reference_loop():
            for row in range(rows):
                refs[row](ids[row], data[row])

        ref_calls = max(2, calls // max(1, rows // 16))
        reference = gpu_us(torch, reference_loop, data, master, ref_calls, max(3, blocks // 2), warmup=1)
    return {
        "B": rows,
        "ours_us": ours,
        "reference_loop_us": reference,
        "vectorized_torch_us": vec,
        "d2d_copy_us": floor,
        "gpu_equals_cpu": same,
        **agree,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--sizes", default="1,16,64,256", help="batch sizes, comma-separated")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--require-gpu", action="store_true", help="exit 1 (not 0) without a GPU")
    parser.add_argument(
        "--cpu-smoke",
        action="store_true",
        help="run every code path on CPU tensors at B=1,3 (checks the script, measures nothing)",
    )
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]

    try:
        import torch
    except ImportError:
        no_gpu("torch is not installed", args.require_gpu)
    import logits_processing as lp

    if args.cpu_smoke:
        ref = reference()
        for rows in (1, 3):
            r = bench_size(torch, lp, ref, rows, 2, 1, device="cpu")
            assert r["gpu_equals_cpu"], r
            print(f"cpu smoke B={rows}: {r}")
        return
    if not torch.cuda.is_available():
        no_gpu("torch sees no CUDA GPU here", args.require_gpu)

    cuda_support = getattr(lp, "CUDA_SUPPORT", None)
    if cuda_support is None:
        cuda_support = getattr(getattr(lp, "_lib", None), "CUDA_SUPPORT", False)
    if not cuda_support:
        no_gpu(
            "this build of logits_processing has no CUDA support (build with --features cuda)",
            args.require_gpu,
        )

    ref = reference()

    calls, blocks = (10, 5) if args.quick else (30, 11)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, vocab {VOCAB:,}, float32")
    print("median us per decode step (CUDA events, back-to-back steps)\n")
    header = (
        f"{'B':>4} {'ours':>10} {'reference loop':>15} {'vectorized torch':>17} "
        f"{'D2D copy (floor)':>17} {'ours/floor':>11}"
    )
    print(header)
    results = []
    for rows in sizes:
        r = bench_size(torch, lp, ref, rows, calls, blocks)
        results.append(r)
        notes = "" if r["gpu_equals_cpu"] else "   GPU != CPU!"
        if not r.get("vectorized_equals_ours", True):
            notes += "   (vectorized torch differs)"
        if not r.get("reference_equals_ours", True):
            notes += "   (reference differs)"
        print(
            f"{rows:>4} {r['ours_us']:>10.1f} {r['reference_loop_us']:>15.1f} "
            f"{r['vectorized_torch_us']:>17.1f} {r['d2d_copy_us']:>17.1f} "
            f"{r['ours_us'] / r['d2d_copy_us']:>11.2f}{notes}"
        )
        sys.stdout.flush()
        torch.cuda.empty_cache()

    print("\ntargets: ours <= 150 us at B=256, <= 15 us at B=1")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "device": torch.cuda.get_device_name(),
                    "torch": torch.__version__,
                    "vocab": VOCAB,
                    "dtype": "float32",
                    "time": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                    "results": results,
                },
                f,
                indent=1,
            )
    if not all(r["gpu_equals_cpu"] for r in results):
        print("bench_cuda: GPU results differ from the CPU's")
        raise SystemExit(1)


if __name__ == "__main__":
    main()
