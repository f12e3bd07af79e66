"""vLLM Model Runner V2's processor (``VLLMV2LogitsProcessor``) on a device, driven as V2 drives
it: the history in device tensors laid out as V2's ``req_states`` (``all_token_ids [slots,
max_len]``, ``total_len``; ``prompt_len`` / ``prefill_len`` with host copies), a ``LogitsContext``
per step with the rows in a new order each step, and the sampled token written back into the
history on the device, as V2's ``post_update`` does.

For each of two batches, every row history-free (temperature, top-p) and every row reading
history (a repetition penalty before them), it checks every row against the same steps on the
CPU path, bit for bit, and reports a step's cost beside a copy of the same logits on the device,
how many steps read ids back from the device, and (on a GPU) how many times a step waited for the
device (PyTorch's synchronizing calls, counted by ``torch.cuda.set_sync_debug_mode``; at most one
a step, none for history-free rows) and whether ``apply`` returned while the device was still
busy. On a GPU the steps alternate: one called while the device is busy (the waits), the next
timed on an idle device with CUDA events, from before ``apply`` to the end of its work on the
stream (V2's own step context, its host-to-device copies, is built before the window); the copy
is timed the same way. On the CPU both are wall-clock times.

Uses vLLM's own types where vLLM imports; elsewhere (the GPU machine has torch but no vLLM)
stand-ins of the same names and layout.

    python python/benchmarks/bench_vllm_v2.py                 # CUDA if there is a GPU, else CPU
    python python/benchmarks/bench_vllm_v2.py --device cpu --quick
"""

from __future__ import annotations

import abc
import argparse
import contextlib
import dataclasses
import enum
import json
import statistics
import sys
import time
import types
import warnings
from types import SimpleNamespace


def install_standins() -> bool:
    """Modules with the vLLM names the adapter imports, where vLLM is not installed. Returns
    whether they were needed."""
    try:
        import vllm.v1.sample.logits_processor  # noqa: F401
        import vllm.v1.worker.gpu.sample.logits_processor  # noqa: F401

        return False
    except ImportError:
        pass

    class SamplingParams:
        def __init__(self, max_tokens=16, extra_args=None):
            self.max_tokens, self.extra_args = max_tokens, extra_args

    class MoveDirectionality(enum.Enum):
        UNIDIRECTIONAL = 0
        SWAP = 1

    @dataclasses.dataclass(frozen=True)
    class BatchUpdate:
        batch_size: int
        removed: list
        added: list
        moved: list

    class LogitsProcessor(abc.ABC):  # V1's interface
        @classmethod
        def validate_params(cls, sampling_params):
            return None

        @abc.abstractmethod
        def apply(self, logits):
            raise NotImplementedError

    class V2LogitsProcessor(abc.ABC):  # V2's interface
        @classmethod
        def validate_params(cls, sampling_params):
            return None

        def add_request(self, req_idx, sampling_params):
            return True

        def apply_staged_writes(self):
            return None

        @abc.abstractmethod
        def apply(self, logits, ctx):
            raise NotImplementedError

    @dataclasses.dataclass(frozen=True)
    class LogitsContext:
        expanded_idx_mapping: object
        idx_mapping: object
        idx_mapping_np: object
        expanded_local_pos: object
        input_ids: object
        pos: object
        seq_lens_upper_bound_np: object

    modules = {name: types.ModuleType(name) for name in (
        "vllm", "vllm.v1", "vllm.v1.sample", "vllm.v1.sample.logits_processor", "vllm.v1.worker",
        "vllm.v1.worker.gpu", "vllm.v1.worker.gpu.sample", "vllm.v1.worker.gpu.sample.logits_processor",
    )}
    modules["vllm"].SamplingParams = SamplingParams
    v1 = modules["vllm.v1.sample.logits_processor"]
    v1.BatchUpdate, v1.LogitsProcessor, v1.MoveDirectionality = BatchUpdate, LogitsProcessor, MoveDirectionality
    v2 = modules["vllm.v1.worker.gpu.sample.logits_processor"]
    v2.LogitsProcessor, v2.LogitsContext = V2LogitsProcessor, LogitsContext
    sys.modules.update(modules)
    return True


def request_state(torch, device, slots, max_len, vocab):
    """V2's per-slot history as ``LogitsProcRequestState`` lays it out."""
    import numpy as np

    def host(n):
        return SimpleNamespace(np=np.zeros(n, dtype=np.int32))

    return SimpleNamespace(
        device=device,
        max_num_reqs=slots,
        vocab_size=vocab,
        all_token_ids=SimpleNamespace(gpu=torch.zeros(slots, max_len, dtype=torch.int32, device=device)),
        prompt_len=host(slots),
        prefill_len=host(slots),
        total_len=SimpleNamespace(gpu=torch.zeros(slots, dtype=torch.int32, device=device)),
    )


class Runner:
    """One V2 processor on one device, with its requests in slots ``0..rows-1``."""

    def __init__(self, adapter, torch, device, rows, vocab, specs, prompt, max_len):
        import numpy as np

        self.np, self.torch, self.device = np, torch, device
        config = SimpleNamespace(
            model_config=SimpleNamespace(get_vocab_size=lambda: vocab, tokenizer=None, model="bench"),
            kv_transfer_config=None,
            speculative_config=None,
        )
        self.state = request_state(torch, device, rows, max_len, vocab)
        self.proc = adapter.VLLMLogitsProcessor(config, self.state)
        from vllm import SamplingParams

        for slot in range(rows):
            ids = [(slot * 7 + i) % vocab for i in range(prompt)]
            self.state.prompt_len.np[slot] = self.state.prefill_len.np[slot] = prompt
            self.state.all_token_ids.gpu[slot, :prompt] = torch.tensor(ids, dtype=torch.int32)
            self.state.total_len.gpu[slot] = prompt
            assert self.proc.add_request(slot, SamplingParams(extra_args={adapter.SPEC_KEY: specs}))
        self.seq_lens = np.full(rows, prompt, dtype=np.int32)
        from vllm.v1.worker.gpu.sample.logits_processor import LogitsContext

        self.context = LogitsContext

    def context_for(self, order):
        """The step's ``LogitsContext``: rows in ``order``'s slots, each one token past its last."""
        torch, np = self.torch, self.np
        slots = np.asarray(order, dtype=np.int32)
        mapping = torch.from_numpy(slots).to(self.device)
        seq_lens = self.seq_lens[slots]
        return self.context(
            expanded_idx_mapping=mapping,
            idx_mapping=mapping,
            idx_mapping_np=slots,
            expanded_local_pos=torch.zeros(len(slots), dtype=torch.int32, device=self.device),
            input_ids=torch.zeros(len(slots), dtype=torch.int32, device=self.device),
            pos=torch.from_numpy(seq_lens - 1).to(self.device),
            seq_lens_upper_bound_np=seq_lens,
        )

    def post_update(self, out, order):
        """V2's post_update, on the device: each row's argmax appended to its slot's history."""
        torch, np = self.torch, self.np
        slots = np.asarray(order, dtype=np.int32)
        index = torch.from_numpy(slots).to(self.device).long()
        at = torch.from_numpy(self.seq_lens[slots]).to(self.device).long()
        self.state.all_token_ids.gpu[index, at] = out.argmax(-1).to(torch.int32)
        self.state.total_len.gpu[index] += 1
        self.seq_lens[slots] += 1

    def step(self, logits, order):
        out = self.proc.apply(logits, self.context_for(order))
        self.post_update(out, order)
        return out


@contextlib.contextmanager
def synchronizing_calls(torch):
    """The calls that wait for the device inside the block, as PyTorch's sync debug mode warns of
    them (a read back, a copy from pageable memory)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield caught
        finally:
            torch.cuda.set_sync_debug_mode("default")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    parser.add_argument("--vocab", type=int, default=151_936)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--quick", action="store_true", help="8 rows, 32,000 ids, 10 steps")
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args()
    if args.quick:
        args.vocab, args.rows, args.steps = 32_000, 8, 10

    import torch

    standins = install_standins()
    from logits_processing.adapters import vllm as adapter

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    gpu = device.type == "cuda"
    print(f"device: {torch.cuda.get_device_name(device) if gpu else 'cpu'}; vLLM types: "
          f"{'stand-ins' if standins else 'vLLM ' + __import__('vllm').__version__}")
    batches = {
        "history-free (temperature, top-p)": [
            {"kind": "temperature", "temperature": 0.7}, {"kind": "top_p", "p": 0.9}],
        "reads history (repetition penalty, temperature, top-p)": [
            {"kind": "repetition_penalty", "penalty": 1.1},
            {"kind": "temperature", "temperature": 0.7}, {"kind": "top_p", "p": 0.9}],
    }
    generator = torch.Generator().manual_seed(0)
    results, failed = {}, False
    for name, specs in batches.items():
        runs = {d: Runner(adapter, torch, d, args.rows, args.vocab, specs, 32, 32 + args.steps + 8)
                for d in ({device, torch.device("cpu")})}
        mismatched, times, copies, returned_busy, waits = 0, [], [], [], []
        if gpu:
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        for step in range(args.steps):
            host = torch.randn(args.rows, args.vocab, generator=generator) * 4
            order = list(range(args.rows))
            order = order[step % args.rows:] + order[: step % args.rows]
            want = runs[torch.device("cpu")].step(host.clone(), order) if gpu else None
            logits = host.to(device)
            if gpu and step % 2 == 0:
                # V2 builds the step's context (its host-to-device copies) before the sampler.
                context = runs[device].context_for(order)
                torch.cuda.synchronize(device)
                torch.cuda._sleep(20_000_000)  # the device is busy when apply is called
                with synchronizing_calls(torch) as synced:
                    got = runs[device].proc.apply(logits, context)
                waits.append(sum("synchroniz" in str(w.message) for w in synced))
                returned_busy.append(not torch.cuda.current_stream(device).query())
                runs[device].post_update(got, order)
                torch.cuda.synchronize(device)
                mismatched += int(not torch.equal(got.cpu(), want))
            elif gpu:
                context = runs[device].context_for(order)
                torch.cuda.synchronize(device)
                start.record()
                got = runs[device].proc.apply(logits, context)
                end.record()
                runs[device].post_update(got, order)
                torch.cuda.synchronize(device)
                times.append(start.elapsed_time(end) / 1e3)
                start.record()
                logits.clone()
                end.record()
                torch.cuda.synchronize(device)
                copies.append(start.elapsed_time(end) / 1e3)
                mismatched += int(not torch.equal(got.cpu(), want))
            else:
                t0 = time.perf_counter()
                runs[device].step(logits, order)
                times.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                logits.clone()
                copies.append(time.perf_counter() - t0)
        step_ms, copy_ms = statistics.median(times) * 1e3, statistics.median(copies) * 1e3
        result = {
            "rows": args.rows, "vocab": args.vocab, "steps": args.steps,
            "step_ms_median": round(step_ms, 4), "copy_ms_median": round(copy_ms, 4),
            "ratio_to_copy": round(step_ms / copy_ms, 2),
            "device_reads": runs[device].proc.device_reads,
            "rows_differing_from_cpu": mismatched if gpu else None,
            "apply_returned_while_device_busy": (sum(returned_busy) == len(returned_busy)) if gpu else None,
            "most_waits_in_a_step": max(waits) if gpu else None,
        }
        results[name] = result
        print(f"{name}: step {step_ms:.3f} ms, copy of the logits {copy_ms:.3f} ms "
              f"({result['ratio_to_copy']}x); steps that read ids back: {result['device_reads']}/{args.steps}"
              + (f"; steps differing from the CPU path: {mismatched}; apply returned while the device "
                 f"was busy: {sum(returned_busy)}/{len(returned_busy)}; most waits in a step: "
                 f"{max(waits)}" if gpu else ""))
        history_free = "history-free" in name
        failed |= bool(mismatched) or (history_free and result["device_reads"] != 0)
        failed |= gpu and max(waits) > (0 if history_free else 1)
        failed |= (not history_free) and result["device_reads"] != args.steps
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
