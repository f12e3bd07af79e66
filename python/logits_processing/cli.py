"""The ``logits-processing`` command (also ``python -m logits_processing``).

- ``check SPEC``: validates a spec list (a file, ``-`` for stdin, or inline JSON) as admission
  would (:func:`logits_processing.validate_specs`: the same verdicts, messages and field paths);
  exit 0, or 1 with every error listed.
- ``kinds``: every kind with its fields, types, defaults and meaning; ``--json-schema`` prints the
  spec language's JSON Schema (docs/spec.schema.json).
- ``bench``: each kind's step cost on this machine beside a memcpy of the same block.
- ``info``: the version, the CPU path, CUDA and NVRTC, the engines installed here.
- ``convert SETTINGS --from llamacpp|webui|koboldcpp|vllm|openai``: the spec list for a source's
  sampling settings (:mod:`logits_processing.convert`; JSON, or YAML as webui presets are, when
  PyYAML is installed), with the fields it could not convert; exit 1 when there are some.

Exit codes, the same for every subcommand: 0 done (``check``: the specs are valid), 1 ``check``
found invalid specs, 2 bad usage or input (an unknown option, a number out of its range, a file
that cannot be read or is not UTF-8, a tokenizer that does not load), each said in one line on
stderr; 3 is a bug in the command (one line too, naming the exception), 130 an interrupt.
A subcommand is a function that adds its parser (see :data:`SUBCOMMANDS`); it raises
:class:`UsageError` for bad input, and its ``--json`` output goes through :func:`print_json`.

Everything about the kinds comes from the extension (its registry's JSON Schema); nothing is
listed here by hand. Importing this module imports neither torch nor numpy (``bench`` imports
numpy when it runs).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any, Callable

from . import _lib

PROG = "logits-processing"
EXIT_OK, EXIT_INVALID, EXIT_USAGE, EXIT_BUG = 0, 1, 2, 3


class UsageError(Exception):
    """Bad usage or input: :func:`main` prints ``logits-processing <command>: <message>`` on
    stderr and exits 2."""


def count(minimum: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer of at least `minimum`, else a usage error naming it."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    parse.__name__ = f"integer >= {minimum}"
    return parse


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def print_json(data: Any) -> None:
    """``--json`` output: strict JSON (a NaN or an infinity is a bug here, never ``Infinity``)."""
    print(json.dumps(data, indent=2, allow_nan=False))


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is the one line ``prog: error: message`` (exit 2)."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def _schema() -> dict:
    return json.loads(_lib.spec_schema())


def _kind_defs(schema: dict) -> list[tuple[str, dict]]:
    defs = schema["$defs"]
    names = [ref["$ref"].rsplit("/", 1)[1] for ref in defs["spec"]["oneOf"]]
    return [(name, defs[name]) for name in names]


# -- check ---------------------------------------------------------------------------------------


def _decode(data: bytes, name: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"{name}: not UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start})") from None


def _read_spec(arg: str) -> str:
    if arg == "-":
        stdin = getattr(sys.stdin, "buffer", None)  # a StringIO in place of stdin has none
        return sys.stdin.read() if stdin is None else _decode(stdin.read(), "stdin")
    if arg.lstrip()[:1] in ("[", "{"):
        return arg  # a lone surrogate (non-UTF-8 argv) is the core's to refuse, as a SpecError
    try:
        with open(arg, "rb") as f:
            data = f.read()
    except OSError as e:
        raise UsageError(f"{arg!r}: not inline JSON and {(e.strerror or str(e)).lower()}") from None
    return _decode(data, repr(arg))


def _error(e: Exception) -> dict:
    return {"field": getattr(e, "field", None), "error": type(e).__name__, "message": str(e)}


def _at(error: dict, i: int) -> dict | None:
    """An error of the one-spec list ``[spec]`` as admission names it at place `i` of the list;
    None for one that names no place (text the core does not read as JSON, a number too large)."""
    field = error["field"]
    if not isinstance(field, str) or not field.startswith("[0]"):
        return None
    if i == 0:
        return error
    moved = f"[{i}]{field[3:]}"
    return {**error, "field": moved, "message": error["message"].replace(field, moved, 1)}


def check_text(text: str, **context: Any) -> list[dict]:
    """Every error in a spec list: the first exactly as :func:`validate_specs` reports it, then
    one per further spec that admission would refuse, each named by its place in the list.

    Each spec is validated once, on its own (as ``[spec]``, its path then given its place), so
    the cost is linear in the list, and a list over the pipeline limit is one error, not one per
    spec past the limit. A rule between specs (their order) is found by the whole list's check,
    which gives the first error."""
    from . import SpecError

    try:
        _lib.validate_specs(text, **context)
        return []
    except SpecError as e:
        errors = [_error(e)]
    try:
        specs = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or nested deeper than Python parses
        return errors
    if not isinstance(specs, list):
        return errors
    seen = {json.dumps(errors[0], sort_keys=True)}
    for i, spec in enumerate(specs):
        try:
            _lib.validate_specs(json.dumps([spec], allow_nan=False), **context)
        except SpecError as e:
            error = _at(_error(e), i)
            key = json.dumps(error, sort_keys=True)
            if error is not None and key not in seen:
                seen.add(key)
                errors.append(error)
        except (ValueError, RecursionError):  # a number Python reads and JSON cannot write (1e999)
            continue
    return errors


def _context(args: argparse.Namespace) -> dict:
    """What admission in an engine would know (the vocab, "Hello world!", the thinking tokens),
    as the keyword arguments of :func:`validate_specs`: the engine's :class:`EngineContext`."""
    from . import EngineContext, LogitsProcessingError

    if not (args.tokenizer or args.model_name or args.vocab is not None):
        return {}
    option = "--tokenizer" if args.tokenizer else "--model-name" if args.model_name else "--vocab"
    try:
        vocab = args.vocab
        if args.tokenizer:
            tokenizer = load_tokenizer(args.tokenizer)
            vocab = tokenizer.vocab_size if vocab is None else vocab
        return {
            "context": EngineContext(args.tokenizer or None, model_name=args.model_name, vocab_size=vocab)
        }
    except LogitsProcessingError as e:  # a tokenizer that does not load, a name that is not text
        raise UsageError(f"{option}: {e}") from None


def load_tokenizer(path: str):
    """The :class:`Vocab` of a tokenizer.json, or a :class:`UsageError` saying why not."""
    from . import LogitsProcessingError, Vocab

    if os.path.isdir(path):
        raise UsageError(f"--tokenizer: {path!r} is a directory (give its tokenizer.json)")
    try:
        return Vocab(path)
    except LogitsProcessingError as e:
        raise UsageError(f"--tokenizer: {e}") from None


def _check(args: argparse.Namespace) -> int:
    text = _read_spec(args.spec)
    errors = check_text(text, **_context(args))
    if args.json:
        print_json({"ok": not errors, "errors": errors})
    elif errors:
        for e in errors:
            print(f"{e['error']}: {e['message']}")
    else:
        print("ok")
    return EXIT_INVALID if errors else EXIT_OK


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
        print_json(table)
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


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not a POSIX system
        return None


def _bench(args: argparse.Namespace) -> int:
    import time

    try:
        import numpy as np
    except ImportError:
        raise UsageError("needs numpy") from None
    from . import Batch, EngineContext, ThinkingTokenConfig

    table = kinds_table(_schema())
    names = args.kinds or [k["kind"] for k in table]
    unknown = sorted(set(names) - {k["kind"] for k in table})
    if unknown:
        raise UsageError(f"--kinds: unknown kinds: {', '.join(unknown)}")
    tokenizer = load_tokenizer(args.tokenizer) if args.tokenizer else None  # for the grammar kinds
    vocab = args.vocab if tokenizer is None else max(args.vocab, tokenizer.vocab_size)
    context = EngineContext(tokenizer, hello_world=([1, 2, 3], 0), thinking_tokens=ThinkingTokenConfig(1, 2, 3))
    # Two float32 blocks of [rows, vocab] (and the history): refuse what this machine cannot hold
    # rather than be killed for memory half-way.
    needed, memory = 2 * 4 * args.rows * vocab, _memory_bytes()
    if memory is not None and needed > memory // 2:
        raise UsageError(f"--rows {args.rows} x --vocab {vocab}: two float32 blocks of "
                         f"{needed / 2**30:.1f} GiB, over half of this machine's "
                         f"{memory / 2**30:.1f} GiB")
    rng = np.random.default_rng(0)
    # Each step reads `source` and writes `block` (out=): fresh logits every step, and the same
    # traffic as the memcpy beside it.
    try:
        source = rng.standard_normal((args.rows, vocab), dtype=np.float32)
        block = np.empty_like(source)
        all_allowed = np.full((args.rows, (vocab + 31) // 32), -1, dtype=np.int32)
    except MemoryError:
        raise UsageError(f"--rows {args.rows} x --vocab {vocab}: cannot allocate the blocks") from None
    ids = [list(range(1, 9)) for _ in range(args.rows)]

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
            batch = Batch(vocab, context=context)
            for r in range(args.rows):
                batch.add(r, spec, prompt_len=0)  # every id of the history is output
            extra = {"bitmask": all_allowed} if name == "bitmask" else {}
            row["us_per_step"] = per_step(lambda: batch.apply(source, ids, out=block, **extra)) * 1e6  # noqa: B023
            row["vs_memcpy"] = _finite(row["us_per_step"] / (memcpy * 1e6)) if memcpy > 0 else None
        except Exception as e:  # a kind that needs what the bench has not got (a tokenizer)
            row["skipped"] = f"{type(e).__name__}: {e}"
        rows.append(row)
    print(f"\r{' ' * 64}\r", end="", file=sys.stderr, flush=True)
    if args.json:
        print_json({"vocab": vocab, "rows": args.rows, "memcpy_us": memcpy * 1e6, "kinds": rows})
        return 0
    print(f"vocab {vocab}, {args.rows} rows, float32, read from one block and written to another; "
          f"best of {args.repeat} x {args.steps} steps")
    print(f"{'kind':<34} {'us/step':>10} {'x memcpy':>9}")
    print(f"{'(memcpy of the block)':<34} {memcpy * 1e6:>10.1f} {1:>9.2f}")
    for row in rows:
        if "skipped" in row:
            print(f"{row['kind']:<34} {'-':>10} {'-':>9}  skipped: {row['skipped']}")
        else:
            ratio = "-" if row["vs_memcpy"] is None else f"{row['vs_memcpy']:.2f}"
            print(f"{row['kind']:<34} {row['us_per_step']:>10.1f} {ratio:>9}")
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
        print_json(data)
        return 0
    print(f"logits-processing {data['version']} (Python {data['python']})")
    print(f"  extension: {data['extension']}")
    print(f"  CPU path:  {data['cpu_path']} (detected: {', '.join(data['cpu_features']) or 'none'};"
          " LOGITS_PROCESSING_CPU=avx2 or portable caps it)")
    print(f"  CUDA:      {'compiled in' if data['cuda_support'] else 'not compiled in'}; "
          f"{'a GPU can be used' if data['cuda'] is None else data['cuda']}")
    print(f"  kernels:   {data['kernels']}")
    print("  packages:  " + ", ".join(f"{name} {version or '-'}" for name, version in data["packages"].items()))
    for name, verdict in data["adapters"].items():
        print(f"  adapter {name}: {verdict}")
    return 0


# -- main ----------------------------------------------------------------------------------------


def _add_check(sub) -> None:
    c = sub.add_parser("check", help="validate a spec list as admission would")
    c.add_argument("spec", help="a file, - for stdin, or inline JSON")
    source = c.add_mutually_exclusive_group()
    source.add_argument("--tokenizer", metavar="PATH",
                        help="a tokenizer.json: its vocab size, its 'Hello world!', its thinking tokens")
    source.add_argument("--model-name", metavar="NAME", help="the model, for its thinking tokens")
    c.add_argument("--vocab", type=count(1), metavar="N", help="token ids must be below N")
    c.add_argument("--json", action="store_true", help="the verdict as JSON")
    c.set_defaults(run=_check)


def _add_kinds(sub) -> None:
    k = sub.add_parser("kinds", help="every kind with its fields, or the JSON Schema")
    k.add_argument("--json-schema", action="store_true", help="print the spec language's JSON Schema")
    k.add_argument("--json", action="store_true", help="the table as JSON")
    k.set_defaults(run=_kinds)


def _add_bench(sub) -> None:
    b = sub.add_parser("bench", help="each kind's step cost beside a memcpy")
    b.add_argument("--vocab", type=count(1), default=151_936, metavar="N")
    b.add_argument("--rows", type=count(1), default=8, metavar="B")
    b.add_argument("--kinds", nargs="+", metavar="KIND")
    b.add_argument("--tokenizer", metavar="PATH", help="a tokenizer.json, for the grammar kinds")
    b.add_argument("--steps", type=count(1), default=20, metavar="N", help="steps per timing (default 20)")
    b.add_argument("--repeat", type=count(1), default=5, metavar="N",
                   help="timings, the best is kept (default 5)")
    b.add_argument("--json", action="store_true")
    b.set_defaults(run=_bench)


def _add_info(sub) -> None:
    i = sub.add_parser("info", help="version, CPU path, CUDA, engines installed")
    i.add_argument("--json", action="store_true")
    i.set_defaults(run=_info)


def _add_convert(sub) -> None:
    from .convert import SOURCES

    c = sub.add_parser(
        "convert",
        help="a spec list from llama.cpp, text-generation-webui, KoboldCpp, vLLM or OpenAI-style settings",
    )
    c.add_argument("settings", help="a JSON (or YAML) file, - for stdin, or inline JSON")
    c.add_argument("--from", dest="source", choices=sorted(SOURCES), required=True)
    c.set_defaults(run=_convert)


def _convert(args) -> int:
    """Prints ``{"specs": [...], "unsupported": {...}}``; exit 0, or 1 when some field could not
    be converted (the specs still printed)."""
    from .convert import SOURCES

    text = _read_spec(args.settings)
    try:
        settings = json.loads(text)
    except ValueError as e:
        settings = _yaml(text)
        if settings is None:
            raise UsageError(f"{args.settings}: not JSON (nor YAML, with PyYAML installed): {e}") from None
    if not isinstance(settings, dict):
        raise UsageError(f"{args.settings}: expected a JSON object of settings")
    try:
        converted = SOURCES[args.source](settings)
    except (TypeError, ValueError) as e:
        raise UsageError(f"{args.settings}: {e}") from None
    print_json(converted.as_json())
    return EXIT_INVALID if converted.unsupported else 0


def _yaml(text: str) -> Any:
    """`text` as YAML (a webui preset), or None when it is not or PyYAML is not installed."""
    try:
        import yaml
    except ImportError:
        return None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return None


def _add_explain(sub) -> None:
    from . import explain

    explain.add_parser(sub)


# Each subcommand: a function that adds its parser to the subparsers and sets ``run``, a function
# of the parsed arguments that returns the exit code (or raises UsageError).
SUBCOMMANDS: list[Callable[[Any], None]] = [_add_check, _add_kinds, _add_bench, _add_info, _add_convert, _add_explain]


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    for add in SUBCOMMANDS:
        add(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """Runs the command; returns its exit code (see the module's docstring), never raises."""
    try:
        args = parser().parse_args(argv)
    except SystemExit as e:  # --help (0), or a usage error argparse has printed (2)
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    try:
        return args.run(args)
    except UsageError as e:
        print(f"{PROG} {args.command}: {e}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # `| head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_INVALID
    except KeyboardInterrupt:
        print(f"{PROG} {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug here: one line, not a traceback
        print(f"{PROG} {args.command}: internal error: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_BUG


if __name__ == "__main__":
    sys.exit(main())
