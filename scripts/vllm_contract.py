"""Freeze the parts of vLLM's HTTP API this package uses into `tests/data/vllm_contract.json`, read from the released
wheels with `ast` (nothing is imported from vLLM, nothing is copied out of the wheels but names and literal defaults).

    pip download --no-deps vllm==0.22.0 -d /tmp/vllm022      # ... and 0.26.0, 0.27.0, 0.28.0, 0.31.0
    python scripts/vllm_contract.py /tmp/vllm022/*.whl /tmp/vllm026/*.whl ... [--out tests/data/vllm_contract.json]

Per version the file lists, for each request/response class we send or parse (`CLASSES`): its fields with their
literal defaults (an expression that is not a literal is kept as the string "<expr>") and its pydantic `extra`
setting (vLLM's `OpenAIBaseModel` allows and ignores unknown fields); every HTTP route (`METHOD /path`), with the
request class of the routes we call; and the field names of the config sections `/server_info` reports
(`model_config.logprobs_mode`, `scheduler_config.max_num_seqs`). The contract tests
(`tests/unit/rollout/test_vllm_contract.py`) check our payloads and parsers against it, so a vLLM release that renames
or drops a field fails a test here instead of a run on a cluster. Regenerate it when the supported range changes.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
import zipfile
from pathlib import Path
from typing import Any

# The classes we send or parse: name -> (what it is, the module folders it lives in across versions).
CLASSES: dict[str, str] = {
    "CompletionRequest": "POST /v1/completions body",
    "CompletionResponse": "POST /v1/completions answer",
    "CompletionResponseChoice": "one choice of the answer",
    "CompletionLogProbs": "a choice's `logprobs`",
    "Logprob": "one token of a choice's `prompt_logprobs` ({token id: Logprob}; vllm/logprobs.py)",
    "UsageInfo": "the answer's `usage`",
    "ModelList": "GET /v1/models answer",
    "ModelCard": "one served model of /v1/models",
    "ErrorResponse": "every error answer",
    "ErrorInfo": "an error answer's `error`",
    "LoadLoRAAdapterRequest": "POST /v1/load_lora_adapter body",
    "UnloadLoRAAdapterRequest": "POST /v1/unload_lora_adapter body",
    "TokenizeCompletionRequest": "POST /tokenize body (text prompt)",
    "TokenizeResponse": "POST /tokenize answer",
    "WeightTransferInitRequest": "POST /init_weight_transfer_engine body (TRL's NCCL client)",
    "WeightTransferUpdateRequest": "POST /update_weights body (TRL's NCCL client)",
}
CONFIGS = ("ModelConfig", "SchedulerConfig", "VllmConfig")  # /server_info?config_format=json: vllm_config.<section>
SOURCE_ROOTS = ("vllm/entrypoints/", "vllm/distributed/weight_transfer/", "vllm/config/", "vllm/logprobs.py")
EXPR = "<expr>"  # a default that is not a literal (a call, a name)


def _modules(wheel: Path) -> dict[str, ast.Module]:
    with zipfile.ZipFile(wheel) as archive:
        return {name: ast.parse(archive.read(name).decode("utf-8"), name) for name in archive.namelist()
                if name.endswith(".py") and name.startswith(SOURCE_ROOTS)}


def _version(wheel: Path) -> str:
    match = re.search(r"vllm-([0-9][^-]*)-", wheel.name)
    if match is None:
        raise SystemExit(f"{wheel}: not a vllm wheel name (vllm-<version>-...whl)")
    return match.group(1)


def _default(value: ast.expr | None) -> Any:
    """The literal default of a field (`x: int = 3`, `x: int = Field(default=3)`), EXPR when there is none to read,
    and the string "<required>" when the field has no default."""
    if value is None:
        return "<required>"
    if isinstance(value, ast.Call) and getattr(value.func, "id", getattr(value.func, "attr", "")) == "Field":
        keywords = {k.arg: k.value for k in value.keywords}
        if "default_factory" in keywords:
            return EXPR
        value = keywords.get("default", value.args[0] if value.args else None)
        if value is None or (isinstance(value, ast.Constant) and value.value is Ellipsis):
            return "<required>"
    try:
        return ast.literal_eval(value)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return EXPR


def _is_classvar(annotation: ast.expr) -> bool:
    text = ast.unparse(annotation)
    return text.startswith(("ClassVar", "typing.ClassVar"))


def _extra(node: ast.ClassDef) -> str | None:
    """`model_config = ConfigDict(extra=...)` of the class itself, None when it sets none."""
    for statement in node.body:
        if (isinstance(statement, ast.Assign) and any(getattr(t, "id", "") == "model_config" for t in statement.targets)
                and isinstance(statement.value, ast.Call)):
            for keyword in statement.value.keywords:
                if keyword.arg == "extra":
                    return _default(keyword.value)
    return None


class _Index:
    """Every class of the read modules, by name, for resolving base classes."""

    def __init__(self, modules: dict[str, ast.Module]) -> None:
        self.by_name: dict[str, list[tuple[str, ast.ClassDef]]] = {}
        for name, tree in modules.items():
            for node in tree.body:
                if isinstance(node, ast.ClassDef):
                    self.by_name.setdefault(node.name, []).append((name, node))

    def find(self, name: str, near: str | None = None) -> tuple[str, ast.ClassDef] | None:
        found = self.by_name.get(name, [])
        same = [f for f in found if f[0] == near]
        return (same or found or [None])[0]

    def describe(self, name: str) -> dict[str, Any] | None:
        """Fields (own and inherited from classes in these modules, the subclass's default winning) and `extra`."""
        found = self.find(name)
        if found is None:
            return None
        module, node = found
        fields: dict[str, Any] = {}
        extra = None
        for _module, base in reversed(self._lineage(module, node)):
            extra = _extra(base) or extra
            for statement in base.body:
                if (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
                        and not _is_classvar(statement.annotation) and not statement.target.id.startswith("_")):
                    fields[statement.target.id] = _default(statement.value)
        return {"module": module, "extra": extra or "ignore", "fields": dict(sorted(fields.items()))}

    def _lineage(self, module: str, node: ast.ClassDef) -> list[tuple[str, ast.ClassDef]]:
        """The class, then its bases found in these modules, depth first (pydantic's `BaseModel` ends the chain)."""
        chain, todo, seen = [], [(module, node)], set()
        while todo:
            mod, cls = todo.pop(0)
            if (mod, cls.name) in seen:
                continue
            seen.add((mod, cls.name))
            chain.append((mod, cls))
            for base in cls.bases:
                base_name = getattr(base, "id", getattr(base, "attr", None))
                found = self.find(base_name, mod) if base_name else None
                if found is not None:
                    todo.append(found)
        return chain


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef, index: _Index) -> dict[str, Any]:
    """A handler's request class (a parameter annotated with a known class; None: it reads the raw request or
    single fields) and its single body / query fields (`Body(embed=True)`, `Query()` parameters)."""
    args = node.args.args
    defaults = [None] * (len(args) - len(node.args.defaults)) + list(node.args.defaults)
    request, body, query = None, [], []
    for arg, default in zip(args, defaults, strict=True):
        annotation = ast.unparse(arg.annotation) if arg.annotation is not None else ""
        spelled = annotation + " " + (ast.unparse(default) if default is not None else "")
        if annotation in index.by_name and request is None:
            request = annotation
        elif "Body(" in spelled:
            body.append(arg.arg)
        elif "Query(" in spelled:
            query.append(arg.arg)
    out: dict[str, Any] = {"request": request}
    if body:
        out["body"] = body
    if query:
        out["query"] = query
    return out


def _routes(modules: dict[str, ast.Module], index: _Index) -> dict[str, dict[str, Any]]:
    """`METHOD /path` -> its module and the request class its handler takes (None: it reads the raw request)."""
    routes: dict[str, dict[str, Any]] = {}
    for module, tree in modules.items():
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for decorator in node.decorator_list:
                call = decorator if isinstance(decorator, ast.Call) else None
                method = getattr(getattr(call, "func", None), "attr", None)
                if method not in ("get", "post", "put", "delete") or not call.args:
                    continue
                path = call.args[0]
                if not (isinstance(path, ast.Constant) and isinstance(path.value, str)):
                    continue
                routes[f"{method.upper()} {path.value}"] = {"module": module, **_parameters(node, index)}
    return dict(sorted(routes.items()))


def describe_wheel(wheel: Path) -> dict[str, Any]:
    modules = _modules(wheel)
    index = _Index(modules)
    classes = {name: index.describe(name) for name in CLASSES}
    configs = {}
    for name in CONFIGS:
        described = index.describe(name)
        configs[name] = None if described is None else sorted(described["fields"])
    return {"classes": classes, "routes": _routes(modules, index), "configs": configs}


def _dump(value: Any, depth: int = 0) -> str:
    """JSON with one line per class, route and config list (small, and a regenerated file diffs by entry)."""
    leaf = depth >= 4 or not isinstance(value, dict)
    if leaf:
        return json.dumps(value)
    pad = " " * (depth + 1)
    items = [f"{pad}{json.dumps(k)}: {_dump(v, depth + 1)}" for k, v in value.items()]
    return "{\n" + ",\n".join(items) + "\n" + " " * depth + "}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("wheels", nargs="+", type=Path, help="vllm-<version>-*.whl files (pip download --no-deps)")
    parser.add_argument("--out", type=Path, default=Path("tests/data/vllm_contract.json"))
    args = parser.parse_args(argv)
    versions = {}
    for wheel in sorted(args.wheels, key=lambda w: tuple(int(p) for p in _version(w).split(".")[:3])):
        versions[_version(wheel)] = describe_wheel(wheel)
        missing = [n for n, c in versions[_version(wheel)]["classes"].items() if c is None]
        print(f"{_version(wheel)}: {len(versions[_version(wheel)]['routes'])} routes; classes not found: {missing}")
    contract = {"generated_by": "scripts/vllm_contract.py", "classes": CLASSES, "versions": versions}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(_dump(contract) + "\n")
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
