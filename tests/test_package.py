"""The Python package's shape: ``_native.pyi`` says what the native module
really has, the package's modules import each other without a circle, every
public module says what it exports, and names the engine owns (folders,
files) are not written a second time in Python. Engine errors arrive as
meshrun's exception classes."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

import meshrun
from meshrun import _native

PACKAGE = ROOT / "python" / "meshrun"
STUB = PACKAGE / "_native.pyi"

# ------------------------------------------------------------ the stub

Params = tuple[tuple[str, str, bool], ...]  # (name, kind, has a default)


def _params(args: ast.arguments, drop_first: bool) -> Params:
    """The parameters of a ``def``: name, kind and whether it has a default."""
    positional = [*args.posonlyargs, *args.args]
    defaults = [False] * (len(positional) - len(args.defaults)) + [True] * len(args.defaults)
    out = [(a.arg, "positional", d) for a, d in zip(positional, defaults)]
    if args.vararg:
        out.append((args.vararg.arg, "*args", False))
    out += [(a.arg, "keyword", d is not None) for a, d in zip(args.kwonlyargs, args.kw_defaults)]
    if args.kwarg:
        out.append((args.kwarg.arg, "**kwargs", False))
    return tuple(out[1:] if drop_first else out)


def _signature(text: str | None, drop_first: bool) -> Params | None:
    """A ``__text_signature__`` (``($self, step, metrics=None)``) parsed as a ``def``."""
    if text is None:
        return None
    fn = ast.parse(f"def f{text.replace('$', '')}: pass").body[0]
    return _params(fn.args, drop_first)


def _from_stub(text: str) -> dict[str, object]:
    """What the stub declares: name -> a function's parameters, a class's
    members, or ``("exception", base)``; variables as ``"variable"``."""
    out: dict[str, object] = {}
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef):
            out[node.name] = _params(node.args, drop_first=False)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = "variable"
        elif isinstance(node, ast.ClassDef):
            bases = [ast.unparse(b) for b in node.bases]
            if bases and bases[0].endswith(("Error", "Exception")):
                out[node.name] = ("exception", bases[0])
                continue
            members: dict[str, object] = {}
            for item in node.body:
                if not isinstance(item, ast.FunctionDef):
                    continue
                decorators = {ast.unparse(d) for d in item.decorator_list}
                if "property" in decorators:
                    members[item.name] = "property"
                elif "staticmethod" in decorators:
                    members[item.name] = _params(item.args, drop_first=False)
                else:
                    members[item.name] = _params(item.args, drop_first=True)
            out[node.name] = members
    return out


def _from_module(module) -> dict[str, object]:
    """The same description, read from the module itself."""
    out: dict[str, object] = {}
    for name, obj in vars(module).items():
        if name.startswith("__") and name != "__version__":
            continue
        if isinstance(obj, type) and issubclass(obj, BaseException):
            out[name] = ("exception", obj.__bases__[0].__name__)
        elif isinstance(obj, type):
            members: dict[str, object] = {}
            constructor = _signature(obj.__text_signature__, drop_first=False)
            if constructor is not None:
                members["__new__"] = constructor
            for member, value in vars(obj).items():
                if member in ("__new__", "__doc__", "__module__"):
                    continue
                if inspect.isgetsetdescriptor(value):
                    members[member] = "property"
                elif isinstance(value, staticmethod):
                    members[member] = _signature(getattr(obj, member).__text_signature__, drop_first=False)
                else:
                    members[member] = _signature(value.__text_signature__, drop_first=True)
            out[name] = members
        elif callable(obj):
            out[name] = _signature(obj.__text_signature__, drop_first=False)
        else:
            out[name] = "variable"
    return out


def stub_differences(stub_text: str, module=_native) -> list[str]:
    """Every way ``stub_text`` and ``module`` disagree, one line each."""
    stub, real = _from_stub(stub_text), _from_module(module)
    found = [f"{n}: in the module, not in the stub" for n in sorted(real.keys() - stub.keys())]
    found += [f"{n}: in the stub, not in the module" for n in sorted(stub.keys() - real.keys())]
    for name in sorted(stub.keys() & real.keys()):
        said, has = stub[name], real[name]
        if isinstance(said, dict) and isinstance(has, dict):
            found += [f"{name}.{m}: in the module, not in the stub" for m in sorted(has.keys() - said.keys())]
            found += [f"{name}.{m}: in the stub, not in the module" for m in sorted(said.keys() - has.keys())]
            found += [
                f"{name}.{m}: the stub says {said[m]}, the module has {has[m]}"
                for m in sorted(said.keys() & has.keys())
                if said[m] != has[m]
            ]
        elif said != has:
            found.append(f"{name}: the stub says {said}, the module has {has}")
    return found


def test_the_stub_says_what_the_native_module_has():
    assert stub_differences(STUB.read_text()) == []


@pytest.mark.parametrize(
    "change, expected",
    [
        # A parameter dropped from a method.
        ("        total_steps: int | None = None,\n", "WorkerClient.report: the stub says"),
        # A function missing.
        ("def stacks_file(scratch: str | PathLike[str], attempt: int, rank: int) -> Path: ...\n", "stacks_file: in the module, not in the stub"),
        # A property missing.
        ("    @property\n    def succeeded(self) -> bool: ...\n", "Outcome.succeeded: in the module, not in the stub"),
        # An exception class missing.
        ("class StorageError(MeshrunError): ...\n", "StorageError: in the module, not in the stub"),
    ],
)
def test_a_stale_stub_is_caught(change, expected):
    text = STUB.read_text()
    assert change in text, "the test's example is no longer in the stub"
    stale = text.replace(change, "")
    assert any(line.startswith(expected) for line in stub_differences(stale)), stub_differences(stale)


def test_a_stub_with_a_wrong_parameter_kind_is_caught():
    stale = STUB.read_text().replace("def run(plan: Plan, *, payload: bytes,", "def run(plan: Plan, payload: bytes, *,")
    assert stub_differences(stale) == [
        "run: the stub says (('plan', 'positional', False), ('payload', 'positional', False), ('env', 'keyword', False)), "
        "the module has (('plan', 'positional', False), ('payload', 'keyword', False), ('env', 'keyword', False))"
    ]


# ----------------------------------------------------------- the imports

def _module_name(path: Path) -> str:
    return "meshrun" if path.stem == "__init__" else f"meshrun.{path.stem}"


# The package's modules that are not Python source: they import nothing of it.
NATIVE = {"meshrun._native"}


def import_graph(sources: dict[str, str]) -> dict[str, set[str]]:
    """Module -> the package's modules it imports, at the top or inside a
    function alike. ``sources``: module name -> its source."""
    graph: dict[str, set[str]] = {name: set() for name in sources}
    for name, text in sources.items():
        for node in ast.walk(ast.parse(text)):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = "meshrun" if node.level else (node.module or "")
                if node.level and node.module:
                    base = f"meshrun.{node.module}"
                if base == "meshrun":
                    # `from meshrun import x`: the module x, else a name of the package.
                    modules = sources.keys() | NATIVE
                    targets = [f"meshrun.{a.name}" if f"meshrun.{a.name}" in modules else "meshrun" for a in node.names]
                else:
                    targets = [base]
            graph[name] |= {t for t in targets if t in sources and t != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A circle of imports (first module repeated at the end), or None."""
    state: dict[str, str] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = "done"
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def package_sources() -> dict[str, str]:
    return {_module_name(p): p.read_text() for p in sorted(PACKAGE.glob("*.py"))}


def test_the_package_imports_without_a_circle():
    graph = import_graph(package_sources())
    assert graph["meshrun.reporting"] >= {"meshrun.checkpoint", "meshrun._recorder"}, "the graph misses imports"
    assert find_cycle(graph) is None, f"import circle: {' -> '.join(find_cycle(graph))}"


def test_a_circle_hidden_in_a_function_is_found():
    sources = {
        "meshrun": "from meshrun.a import f\n",
        "meshrun.a": "from meshrun import b\n",
        "meshrun.b": "def g():\n    from meshrun import a\n",
    }
    assert find_cycle(import_graph(sources)) == ["meshrun.a", "meshrun.b", "meshrun.a"]


# ------------------------------------------------------- what is public

PUBLIC = sorted(p.stem for p in PACKAGE.glob("*.py") if not p.stem.startswith("_"))


@pytest.mark.parametrize("name", PUBLIC)
def test_every_public_module_says_what_it_exports(name):
    tree = ast.parse((PACKAGE / f"{name}.py").read_text())
    declared = [n for n in tree.body if isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in n.targets)]
    assert declared, f"meshrun/{name}.py has no __all__"
    module = importlib.import_module(f"meshrun.{name}")
    missing = [n for n in module.__all__ if not hasattr(module, n)]
    assert missing == [], f"meshrun.{name}.__all__ names what it does not have"
    assert len(set(module.__all__)) == len(module.__all__)


def test_the_package_re_exports_its_public_names_and_nothing_else():
    # The exceptions are there at once; each other public name is its own
    # module's object, imported at its first use.
    assert set(meshrun.__all__) == {*meshrun.errors.__all__, *meshrun._HOME, "__version__"}
    assert all(getattr(meshrun, name) is getattr(meshrun.errors, name) for name in meshrun.errors.__all__)
    for name, home in meshrun._HOME.items():
        assert getattr(meshrun, name) is getattr(importlib.import_module(f"meshrun.{home}"), name), name
    # What type checkers read (the imports under TYPE_CHECKING) is that map.
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    guarded = [node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"]
    assert len(guarded) == 1
    seen = {a.asname or a.name: node.module.removeprefix("meshrun.") for node in guarded[0].body if isinstance(node, ast.ImportFrom) for a in node.names}
    assert seen == meshrun._HOME


def test_the_package_imports_numpy_only_once_a_name_needs_it():
    # Every worker and every `meshrun` command imports the package first.
    code = "import sys, meshrun; before = 'numpy' in sys.modules; meshrun.save; meshrun.checkpoint.wait; print(before, 'numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True"], out.stdout


def test_every_exception_is_a_meshrun_error_exported_by_the_package():
    native = {n for n, o in vars(_native).items() if isinstance(o, type) and issubclass(o, BaseException)}
    assert native == set(meshrun.errors.__all__)
    for name in native:
        assert issubclass(getattr(meshrun, name), meshrun.MeshrunError)


# ----------------------------------------- names the engine owns

# Folder and file names of a run that the Rust crates define; Python asks
# the native module for the paths instead of writing them again.
ENGINE_NAMES = ("checkpoints", "tmp-", "step-", "stacks", "attempt-", "rank-", "manifest.json")


def _string_parts(tree: ast.AST) -> list[tuple[int, str]]:
    """Every string constant and f-string piece that is not a docstring
    (``f"tmp-{step}"`` has the piece ``"tmp-"``)."""
    docstrings = {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef)) and n.body and isinstance(n.body[0], ast.Expr)
    }
    return [
        (n.lineno, n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings
    ]


def spelt_names(source: str) -> list[tuple[int, str]]:
    """(line, string) of every engine name that ``source`` writes itself."""
    return sorted(
        (line, text)
        for line, text in _string_parts(ast.parse(source))
        if any(text == name or text.endswith("/" + name) or text.startswith(name + "/") for name in ENGINE_NAMES)
    )


def test_python_does_not_spell_the_engines_folder_names():
    found = [f"{path.name}:{line}: {text!r}" for path in sorted(PACKAGE.glob("*.py")) for line, text in spelt_names(path.read_text())]
    assert found == []


def test_a_folder_name_spelt_in_python_is_found():
    source = (
        "import os\n\n"
        "def root(run):\n"
        '    """Under checkpoints/."""\n'
        '    os.makedirs(os.path.join(run, "stacks/attempt-1"))\n'
        '    return os.path.join(run, "checkpoints", f"tmp-{1}", "checkpoints need a run")\n'
    )
    assert spelt_names(source) == [(5, "stacks/attempt-1"), (6, "checkpoints"), (6, "tmp-")]


def test_the_engine_gives_the_paths(tmp_path):
    assert _native.checkpoints_dir(str(tmp_path)) == str(tmp_path / "checkpoints")
    assert _native.checkpoints_dir("s3://bucket/team/run") == "s3://bucket/team/run/checkpoints"
    assert _native.stacks_file(tmp_path, 2, 3).parent.parent.parent == tmp_path
    assert _native.stacks_file(tmp_path, 2, 3) != _native.stacks_file(tmp_path, 3, 2)


# ----------------------------------------------- errors from the engine

def fit(tmp_path, **run):
    def train():
        pass

    meshrun.Trainer(train, run_config=meshrun.RunConfig(storage_path=str(tmp_path / "runs"), **run)).fit()


@pytest.mark.parametrize(
    "run, message",
    [
        ({"tee": "some"}, "RunConfig.tee must be 'rank0', 'all' or 'none', got 'some'"),
        ({"tee": None}, "RunConfig.tee must be 'rank0', 'all' or 'none', got None"),
        ({"name": 3}, "RunConfig.name must be a string, got 3"),
        ({"resume_from": True}, "RunConfig.resume_from must be a committed step (an integer) or \"none\" to start from the beginning, got True"),
        ({"failure_config": meshrun.FailureConfig(max_failures=2**70)}, f"FailureConfig.max_failures must be at most {2**32 - 1}, got {2**70}"),
    ],
)
def test_a_bad_run_config_is_a_config_error_naming_the_attribute(tmp_path, run, message):
    with pytest.raises(meshrun.ConfigError) as caught:
        fit(tmp_path, **run)
    assert type(caught.value) is meshrun.ConfigError
    assert str(caught.value) == message
    assert not (tmp_path / "runs").exists()


def test_the_plans_checks_name_the_python_arguments(tmp_path):
    with pytest.raises(meshrun.ConfigError) as caught:
        meshrun.Trainer(lambda: None, scaling_config=meshrun.ScalingConfig(num_workers=3, num_hosts=2), run_config=meshrun.RunConfig(storage_path=str(tmp_path))).fit()
    assert str(caught.value).startswith("ScalingConfig.num_hosts 2 does not divide ScalingConfig.num_workers 3: ")
    assert "--" not in str(caught.value)


def test_a_damaged_checkpoint_is_a_checkpoint_error(tmp_path):
    with pytest.raises(meshrun.CheckpointError) as caught:
        _native.CheckpointReader(tmp_path)
    assert type(caught.value) is meshrun.CheckpointError
    assert "has no manifest.json" in str(caught.value)


def env_names_spelt(source: str) -> list[tuple[int, str]]:
    """(line, string) of every worker-environment name ``source`` writes
    itself instead of reading it from ``meshrun._native.ENV``."""
    return sorted((line, text) for line, text in _string_parts(ast.parse(source)) if re.fullmatch(r"MESHRUN_[A-Z_]+", text))


def test_python_reads_the_environments_names_from_the_engine():
    from meshrun._native import ENV

    found = [f"{path.name}:{line}: {text!r}" for path in sorted(PACKAGE.glob("*.py")) for line, text in env_names_spelt(path.read_text())]
    assert found == []
    # Every key the package reads is one the engine gives.
    used = {key for path in PACKAGE.glob("*.py") for key in re.findall(r'ENV\["([a-z_]+)"\]', path.read_text())}
    assert used and sorted(used - set(ENV)) == [], sorted(used - set(ENV))
    assert ENV["rank"] == "MESHRUN_RANK"


def test_an_environment_name_spelt_in_python_is_found():
    source = 'import os\n\ndef rank():\n    """MESHRUN_RANK, as a docstring may say."""\n    return os.environ["MESHRUN_RANK"], f"set MESHRUN_X=1 {0}"\n'
    assert env_names_spelt(source) == [(5, "MESHRUN_RANK")]


def test_the_python_apis_defaults_are_the_engines(monkeypatch):
    """The dataclasses' defaults of the settings the engine also defaults
    are read from ``_native.DEFAULTS``, not written again in Python; the
    save-error policy a worker follows is read by the engine."""
    import dataclasses

    from meshrun._native import DEFAULTS, ENV

    classes = (meshrun.ScalingConfig, meshrun.CheckpointConfig, meshrun.FailureConfig, meshrun.RunConfig)
    defaults = {f.name: f.default for cls in classes for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}
    assert set(DEFAULTS) <= set(defaults), sorted(set(DEFAULTS) - set(defaults))
    assert {key: defaults[key] for key in DEFAULTS} == DEFAULTS
    tree = ast.parse((PACKAGE / "trainer.py").read_text())
    spelt = [f"{node.target.id} = {node.value.value!r}" for node in ast.walk(tree) if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id in DEFAULTS and isinstance(node.value, ast.Constant)]
    assert spelt == [], spelt
    monkeypatch.setenv(ENV["on_save_error"], "fail")
    assert _native.save_errors_continue() is False
    monkeypatch.setenv(ENV["on_save_error"], "continue")
    assert _native.save_errors_continue() is True
    monkeypatch.delenv(ENV["on_save_error"])
    assert _native.save_errors_continue() is (DEFAULTS["on_save_error"] == "continue")


def test_an_error_before_any_user_code_ran_shows_no_frames_of_meshrun():
    # A SyntaxError in the script, a module not there: raised inside
    # meshrun's bootstrap and runpy alone, shown as `python script.py`
    # shows it, without their frames.
    from meshrun import _runtime

    for name in ("/x/meshrun/_bootstrap.py", "/usr/lib/python3.11/runpy.py"):
        code = compile("raise ImportError('No module named no_such_mod')", name, "exec")
        try:
            exec(code)
        except ImportError as e:
            exc = e.with_traceback(e.__traceback__.tb_next)
        assert exc.__traceback__ is not None
        assert _runtime.user_frames(exc).__traceback__ is None
    # A user's frame after meshrun's is where the traceback starts.
    code = compile("def f():\n    raise ValueError('boom')\n", "/home/u/train.py", "exec")
    space: dict = {}
    exec(code, space)
    boot = compile("f()", "/x/meshrun/_bootstrap.py", "exec")
    try:
        exec(boot, space)
    except ValueError as e:
        exc = e.with_traceback(e.__traceback__.tb_next)
    kept = _runtime.user_frames(exc).__traceback__
    assert kept is not None and kept.tb_frame.f_code.co_filename == "/home/u/train.py"
