"""The ``logits-processing`` command (also ``python -m logits_processing``).

- ``check SPEC``: validates a spec list (a file, ``-`` for stdin, or inline JSON) as admission
  would (:func:`logits_processing.validate_specs`: the same verdicts, messages and field paths);
  exit 0, or 1 with every error listed.
- ``kinds``: every kind with its fields, types, defaults and meaning; ``--json-schema`` prints the
  spec language's JSON Schema (docs/spec.schema.json).
- ``bench``: each kind's step cost on this machine beside a memcpy of the same block.
- ``info``: the version, the CPU path, CUDA and NVRTC, the engines installed here.

Everything about the kinds comes from the extension (its registry's JSON Schema); nothing is
listed here by hand. Importing this module imports neither torch nor numpy (``bench`` imports
numpy when it runs).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from . import _lib

# A spec that is valid whatever the vocab: stands in for the entries before the one being checked,
# so an error names the entry's place in the list as admission of the whole list does.
_PLACEHOLDER = {"kind": "temperature", "temperature": 1}


def _schema() -> dict:
    return json.loads(_lib.spec_schema())


def _kind_defs(schema: dict) -> list[tuple[str, dict]]:
    defs = schema["$defs"]
    names = [ref["$ref"].rsplit("/", 1)[1] for ref in defs["spec"]["oneOf"]]
    return [(name, defs[name]) for name in names]


# -- check ---------------------------------------------------------------------------------------


def _read_spec(arg: str) -> str:
    if arg == "-":
        return sys.stdin.read()
    if arg.lstrip()[:1] in ("[", "{"):
        return arg
    try:
        with open(arg, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise SystemExit(f"logits-processing check: {arg}: not inline JSON and {e.strerror.lower()}") from None


def _error(e: Exception) -> dict:
    return {"field": getattr(e, "field", None), "error": type(e).__name__, "message": str(e)}


def check_text(text: str, **context: Any) -> list[dict]:
    """Every error in a spec list: the first exactly as :func:`validate_specs` reports it, then
    one per further spec that admission would refuse, each named by its place in the list."""
    from . import SpecError

    try:
        _lib.validate_specs(text, **context)
        return []
    except SpecError as e:
        errors = [_error(e)]
    try:
        specs = json.loads(text)
    except ValueError:
        return errors
    if not isinstance(specs, list):
        return errors
    for i, spec in enumerate(specs):
        try:
            _lib.validate_specs(json.dumps([_PLACEHOLDER] * i + [spec]), **context)
        except SpecError as e:
            if _error(e) != errors[0]:
                errors.append(_error(e))
    return errors


def _context(args: argparse.Namespace) -> dict:
    """What admission in an engine would know (the vocab, "Hello world!", the thinking tokens),
    as the keyword arguments of :func:`validate_specs`: the engine's :class:`EngineContext`."""
    from . import EngineContext, GrammarEnv

    vocab = args.vocab
    if args.tokenizer and vocab is None:
        vocab = GrammarEnv(args.tokenizer).vocab_size
    if not (args.tokenizer or args.model_name or vocab is not None):
        return {}
    return {
        "context": EngineContext(args.tokenizer or None, model_name=args.model_name, vocab_size=vocab)
    }


def _check(args: argparse.Namespace) -> int:
    errors = check_text(_read_spec(args.spec), **_context(args))
    if args.json:
        print(json.dumps({"ok": not errors, "errors": errors}, indent=2))
    elif errors:
        for e in errors:
            print(f"{e['error']}: {e['message']}")
    else:
        print("ok")
    return 1 if errors else 0


# -- kinds ---------------------------------------------------------------------------------------


def _type_of(prop: dict, defs: dict) -> str:
    if prop is True or prop == {}:
        return "any JSON"
    if "$ref" in prop:
        return _type_of(defs[prop["$ref"].rsplit("/", 1)[1]], defs)
    if "enum" in prop:
        return " | ".join(json.dumps(v) for v in prop["enum"])
    if "const" in prop:
        return json.dumps(prop["const"])
    if "oneOf" in prop or "anyOf" in prop:
        return " | ".join(_type_of(p, defs) for p in prop.get("oneOf", prop.get("anyOf")))
    kind = prop.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    optional = "null" in kinds
    kinds = [k for k in kinds if k != "null"]
    name = kinds[0] if kinds else "any JSON"
    if name == "array":
        if "prefixItems" in prop:
            name = "[" + ", ".join(_type_of(p, defs) for p in prop["prefixItems"]) + "]"
        else:
            name = f"list of {_type_of(prop.get('items', {}), defs)}"
    elif name == "object" and "patternProperties" in prop:
        (value,) = prop["patternProperties"].values()
        name = f"object of id -> {_type_of(value, defs)}"
    return f"{name} or null" if optional else name


def kinds_table(schema: dict) -> list[dict]:
    """Each kind: its name, description and fields (type, required, default), from the schema."""
    out = []
    for name, kind in _kind_defs(schema):
        fields = []
        for field, prop in kind.get("properties", {}).items():
            if field == "kind":
                continue
            entry = {"name": field, "type": _type_of(prop, schema["$defs"]),
                     "required": field in kind.get("required", [])}
            if isinstance(prop, dict) and "default" in prop:
                entry["default"] = prop["default"]
            fields.append(entry)
        out.append({"kind": name, "description": " ".join(kind.get("description", "").split()),
                    "fields": fields})
    return out


def _kinds(args: argparse.Namespace) -> int:
    if args.json_schema:
        sys.stdout.write(_lib.spec_schema())
        return 0
    table = kinds_table(_schema())
    if args.json:
        print(json.dumps(table, indent=2))
        return 0
    for kind in table:
        print(f"{kind['kind']}: {kind['description']}")
        for f in kind["fields"]:
            extra = "required" if f["required"] else (
                f"default {json.dumps(f['default'])}" if "default" in f else "optional")
            print(f"    {f['name']}: {f['type']} ({extra})")
    return 0


# -- bench ---------------------------------------------------------------------------------------


def _example(description: str) -> Any:
    """The spec a kind's description opens with (`` `{"kind": ...}` ``), when it is JSON."""
    if not description.startswith("`{"):
        return None
    try:
        return json.loads(description[1:description.index("`", 1)])
    except ValueError:
        return None


def _bench(args: argparse.Namespace) -> int:
    import time

    try:
        import numpy as np
    except ImportError:
        print("bench needs numpy", file=sys.stderr)
        return 2
    from . import Batch, GrammarEnv, ThinkingTokenConfig

    table = kinds_table(_schema())
    names = args.kinds or [k["kind"] for k in table]
    unknown = sorted(set(names) - {k["kind"] for k in table})
    if unknown:
        print(f"unknown kinds: {', '.join(unknown)}", file=sys.stderr)
        return 2
    context = {"hello_world": ([1, 2, 3], 0), "thinking_tokens": ThinkingTokenConfig(1, 2, 3)}
    vocab = args.vocab
    if args.tokenizer:  # for the grammar kinds
        context["tokenizer"] = GrammarEnv(args.tokenizer)
        vocab = max(vocab, context["tokenizer"].vocab_size)
    rng = np.random.default_rng(0)
    # Each step reads `source` and writes `block` (out=): fresh logits every step, and the same
    # traffic as the memcpy beside it.
    source = rng.standard_normal((args.rows, vocab), dtype=np.float32)
    block = np.empty_like(source)
    ids = [list(range(1, 9)) for _ in range(args.rows)]
    all_allowed = np.full((args.rows, (vocab + 31) // 32), -1, dtype=np.int32)

    def per_step(step) -> float:
        best = float("inf")
        for _ in range(args.repeat):
            started = time.perf_counter()
            for _ in range(args.steps):
                step()
            best = min(best, (time.perf_counter() - started) / args.steps)
        return best

    memcpy = per_step(lambda: np.copyto(block, source))
    rows = []
    for i, name in enumerate(names):
        print(f"\r[{'#' * (20 * i // len(names)):<20}] {name:<40}", end="", file=sys.stderr, flush=True)
        description = next(k["description"] for k in table if k["kind"] == name)
        spec = _example(description)
        row = {"kind": name, "spec": spec}
        try:
            if spec is None:
                raise ValueError("its description opens with no JSON example")
            batch = Batch(vocab, **context)
            for r in range(args.rows):
                batch.add(r, spec, prompt_len=0)  # every id of the history is output
            extra = {"bitmask": all_allowed} if name == "bitmask" else {}
            row["us_per_step"] = per_step(lambda: batch.apply(source, ids, out=block, **extra)) * 1e6  # noqa: B023
            row["vs_memcpy"] = row["us_per_step"] / (memcpy * 1e6)
        except Exception as e:  # a kind that needs what the bench has not got (a tokenizer)
            row["skipped"] = f"{type(e).__name__}: {e}"
        rows.append(row)
    print(f"\r{' ' * 64}\r", end="", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps({"vocab": vocab, "rows": args.rows, "memcpy_us": memcpy * 1e6,
                          "kinds": rows}, indent=2))
        return 0
    print(f"vocab {vocab}, {args.rows} rows, float32, read from one block and written to another; "
          f"best of {args.repeat} x {args.steps} steps")
    print(f"{'kind':<34} {'us/step':>10} {'x memcpy':>9}")
    print(f"{'(memcpy of the block)':<34} {memcpy * 1e6:>10.1f} {1:>9.2f}")
    for row in rows:
        if "skipped" in row:
            print(f"{row['kind']:<34} {'-':>10} {'-':>9}  skipped: {row['skipped']}")
        else:
            print(f"{row['kind']:<34} {row['us_per_step']:>10.1f} {row['vs_memcpy']:>9.2f}")
    return 0


# -- info ----------------------------------------------------------------------------------------


def _installed(name: str) -> str | None:
    from importlib import metadata

    for dist in (name, name.replace("_", "-")):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return None


# Each adapter module and the packages it imports.
_ADAPTERS = {"hf": ("torch", "transformers"), "vllm": ("torch", "vllm"), "sglang": ("torch", "sglang"),
             "trtllm": ("torch",)}


def _adapter_loads(name: str, needs: tuple[str, ...]) -> str:
    import importlib
    import importlib.util

    missing = [n for n in needs if importlib.util.find_spec(n) is None]
    if missing:
        return f"no ({', '.join(missing)} not installed)"
    try:
        importlib.import_module(f"logits_processing.adapters.{name}")
        return "loads"
    except Exception as e:  # an engine version the adapter does not know, a broken install
        return f"fails: {type(e).__name__}: {e}"


def info() -> dict:
    """What :func:`_lib.build_info` says, the versions of the packages the tensors and engines come
    from, and which engine adapters load here (each is imported: a few seconds with an engine)."""
    out = dict(_lib.build_info())
    out["python"] = sys.version.split()[0]
    out["extension"] = os.path.realpath(_lib.__file__)
    out["packages"] = {name: _installed(name) for name in
                       ("torch", "numpy", "transformers", "vllm", "sglang", "tensorrt_llm", "llguidance",
                        "xgrammar")}
    out["adapters"] = {name: _adapter_loads(name, needs) for name, needs in _ADAPTERS.items()}
    return out


def _info(args: argparse.Namespace) -> int:
    data = info()
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    print(f"logits-processing {data['version']} (Python {data['python']})")
    print(f"  extension: {data['extension']}")
    print(f"  CPU path:  {data['cpu_path']} (detected: {', '.join(data['cpu_features']) or 'none'};"
          " AVX-512 is not used)")
    print(f"  CUDA:      {'compiled in' if data['cuda_support'] else 'not compiled in'}; "
          f"{'a GPU can be used' if data['cuda'] is None else data['cuda']}")
    print(f"  NVRTC:     {data['nvrtc']}")
    print("  packages:  " + ", ".join(f"{name} {version or '-'}" for name, version in data["packages"].items()))
    for name, verdict in data["adapters"].items():
        print(f"  adapter {name}: {verdict}")
    return 0


# -- main ----------------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="logits-processing", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check", help="validate a spec list as admission would")
    c.add_argument("spec", help="a file, - for stdin, or inline JSON")
    source = c.add_mutually_exclusive_group()
    source.add_argument("--tokenizer", metavar="PATH",
                        help="a tokenizer.json: its vocab size, its 'Hello world!', its thinking tokens")
    source.add_argument("--model-name", metavar="NAME", help="the model, for its thinking tokens")
    c.add_argument("--vocab", type=int, metavar="N", help="token ids must be below N")
    c.add_argument("--json", action="store_true", help="the verdict as JSON")
    c.set_defaults(run=_check)
    k = sub.add_parser("kinds", help="every kind with its fields, or the JSON Schema")
    k.add_argument("--json-schema", action="store_true", help="print the spec language's JSON Schema")
    k.add_argument("--json", action="store_true", help="the table as JSON")
    k.set_defaults(run=_kinds)
    b = sub.add_parser("bench", help="each kind's step cost beside a memcpy")
    b.add_argument("--vocab", type=int, default=151_936, metavar="N")
    b.add_argument("--rows", type=int, default=8, metavar="B")
    b.add_argument("--kinds", nargs="+", metavar="KIND")
    b.add_argument("--tokenizer", metavar="PATH", help="a tokenizer.json, for the grammar kinds")
    b.add_argument("--steps", type=int, default=20, help="steps per timing (default 20)")
    b.add_argument("--repeat", type=int, default=5, help="timings, the best is kept (default 5)")
    b.add_argument("--json", action="store_true")
    b.set_defaults(run=_bench)
    i = sub.add_parser("info", help="version, CPU path, CUDA, engines installed")
    i.add_argument("--json", action="store_true")
    i.set_defaults(run=_info)
    from . import explain

    explain.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.run(args)
    except BrokenPipeError:  # `| head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
