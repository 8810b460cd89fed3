"""The package stays straight: no import cycle between pacer_hf modules nor between its folders (function-local
imports counted), none between bench/ and training/, the vLLM proposer free of bench/, costs measured in costs/,
no module past 400 lines and no function past 80, transformers' private API reached only from _hf_compat.py."""

from __future__ import annotations

import ast
from pathlib import Path

import pacer_hf

PACKAGE = Path(pacer_hf.__file__).resolve().parent
MAX_LINES = 400
MAX_FUNCTION_LINES = 80
# Exceptions to the caps: none left. A module or function that must exceed a cap is listed here with its size,
# and may then only shrink.
LONG_MODULES: dict[str, int] = {}
LONG_FUNCTIONS: dict[str, int] = {}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in PACKAGE.rglob("*.py")}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """pacer_hf modules `name` imports anywhere in its file (function-level imports included)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            for alias in node.names:  # `from pkg import module` imports the module, else a name of `pkg`
                found.add(f"{prefix}.{alias.name}" if f"{prefix}.{alias.name}" in known else prefix)
    return {module for module in found if module in known and module != name}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_cycle_inside_the_package():
    found = modules()
    graph = {name: imports_of(name, path, set(found)) for name, path in found.items()}
    assert graph["pacer_hf.generation"] >= {"pacer_hf.strategies", "pacer_hf.loops.lean_loop"}, "the walk sees imports"
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def unit(name: str) -> str:
    """The folder a module lives in (`pacer_hf.loops.lean_loop` -> "loops"), or the top-level module's own name."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "pacer_hf"


def folder_graph() -> dict[str, set[str]]:
    found = modules()
    graph: dict[str, set[str]] = {}
    for name, path in found.items():
        for imported in imports_of(name, path, set(found)):
            if unit(imported) != unit(name):
                graph.setdefault(unit(name), set()).add(unit(imported))
                graph.setdefault(unit(imported), set())
    return graph


def test_folders_import_downward_only():
    """No cycle between folders (and top-level modules), function-local imports included."""
    graph = folder_graph()
    assert graph["bench"] >= {"data", "costs"} and "loops" in graph["strategies"], "the walk sees folder imports"
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_bench_and_training_do_not_import_each_other():
    graph = folder_graph()
    assert "training" not in graph["bench"] and "bench" not in graph["training"]


def test_costs_sit_below_the_loops_and_strategies():
    graph = folder_graph()
    assert not graph["costs"] & {"loops", "strategies", "generation", "training", "bench", "recipes", "vllm"}
    assert "timing" not in graph, "cost measurement lives in pacer_hf.costs"


def test_vllm_proposer_imports_nothing_from_bench():
    found = modules()
    name = "pacer_hf.vllm.proposer"
    assert not {unit(m) for m in imports_of(name, found[name], set(found))} & {"bench", "recipes", "training"}


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_no_module_over_400_lines():
    long = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    grown = {name: n for name, n in long.items() if n > LONG_MODULES.get(name, MAX_LINES)}
    assert not grown, f"split these modules: {grown}"


def test_no_function_over_80_lines():
    long = {}
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if (n := node.end_lineno - node.lineno + 1) > MAX_FUNCTION_LINES:
                    long[f"{name}.{node.name}"] = n
    grown = {name: n for name, n in long.items() if n > LONG_FUNCTIONS.get(name, MAX_FUNCTION_LINES)}
    assert not grown, f"split these functions: {grown}"


def test_model_code_is_self_contained():
    """The configuration_* / modeling_* pairs ship as Hub remote code: each imports only its own configuration."""
    found = modules()
    for model in ("pacer", "lookup_gate"):
        for name in (f"pacer_hf.configuration_{model}", f"pacer_hf.modeling_{model}"):
            assert imports_of(name, found[name], set(found)) <= {f"pacer_hf.configuration_{model}"}, name


# transformers' private generation and cache API that pacer_hf reaches (the version window's check guards it)
HF_PRIVATE = {"_get_candidate_generator", "_pad_token_tensor", "_eos_token_tensor", "activate_past_recording",
              "_speculative_sampling", "_assisted_decoding", "_prepare_special_tokens"}


def private_hf_uses(tree: ast.AST) -> list[tuple[int, str]]:
    """Lines reaching transformers' private API: an attribute or a string naming it, or a private name imported."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in HF_PRIVATE:
            found.append((node.lineno, node.attr))
        elif isinstance(node, ast.Constant) and node.value in HF_PRIVATE:
            found.append((node.lineno, node.value))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "transformers":
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.startswith("_")]
    return sorted(found)


def test_transformers_private_api_only_in_hf_compat():
    uses = {name: hits for name, path in modules().items() if name != "pacer_hf._hf_compat"
            if (hits := private_hf_uses(ast.parse(path.read_text(encoding="utf-8"))))}
    assert not uses, f"reach these through pacer_hf/_hf_compat.py: {uses}"
    compat = private_hf_uses(ast.parse(modules()["pacer_hf._hf_compat"].read_text(encoding="utf-8")))
    assert {"_pad_token_tensor", "activate_past_recording", "_speculative_sampling"} <= {n for _, n in compat}, \
        "the finder sees what _hf_compat reaches"
    sample = "model._get_candidate_generator = f\nx = getattr(c, '_pad_token_tensor')\nfrom transformers.x import _y"
    assert [n for _, n in private_hf_uses(ast.parse(sample))] == ["_get_candidate_generator", "_pad_token_tensor", "_y"]
