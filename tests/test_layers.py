"""The layers stay layered: each module imports only from its own layer and those below.

    tfrecord_pipe/_core      no TensorFlow, no Beam        imports: core
    tfrecord_pipe/_reading   TensorFlow, no Beam           imports: core, reading
    tfrecord_pipe/_grain     Grain, no TensorFlow, no Beam imports: core, grain
    tfrecord_pipe/*.py      the public modules (api)      imports: core, reading, grain
    beam_jobs               Beam, no TensorFlow           imports: core, beam_jobs
    tfrecord_pipe/_tools     the command                   imports: anything

Read from the source (every import, including those inside functions), so a dependency
cannot hide in a function body.
"""

import ast
import pathlib

import pytest

import tfrecord_pipe

ROOT = pathlib.Path(__file__).resolve().parents[1]
ALLOWED = {
    "core": {"core"},
    "reading": {"core", "reading"},
    "grain": {"core", "grain"},
    "api": {"core", "reading", "grain"},
    "beam_jobs": {"core", "beam_jobs"},
    "tools": {"core", "reading", "grain", "api", "beam_jobs", "tools"},
}
FORBIDDEN = {
    "core": {"tensorflow", "keras", "jax", "apache_beam"},
    "reading": {"apache_beam"},
    "grain": {"tensorflow", "keras", "apache_beam"},
    "api": {"apache_beam"},
    "beam_jobs": {"tensorflow", "keras", "jax"},
    "tools": set(),
}


def layer_of(module: str) -> str | None:
    """The layer of one of our modules, by its dotted name; None for the package itself."""
    parts = module.split(".")
    if parts[0] == "tfrecord_pipe" and len(parts) == 2 and parts[1] in tfrecord_pipe.PUBLIC_MODULES:
        return "api"
    if parts[0] == "beam_jobs":
        return "beam_jobs"
    if parts[0] == "tfrecord_pipe":  # _core, _reading, _tools: private by name
        return parts[1].removeprefix("_") if len(parts) > 1 else None
    raise ValueError(module)


def sources():
    """(dotted module name, path) of every module of ours."""
    for package in ("tfrecord_pipe", "beam_jobs"):
        for path in sorted((ROOT / package).rglob("*.py")):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            yield module.removesuffix(".__init__"), path


def imported(path: pathlib.Path) -> set[str]:
    """Every module `path` imports; `from a import b` counts as a.b when that is one of ours,
    and so does `tfrecord_pipe.reader` after `import tfrecord_pipe` (a lazy public name)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: the layer would depend on where the file lies
                names.add(f"relative import from {'.' * node.level}{node.module or ''}")
            elif node.module.split(".")[0] in ("tfrecord_pipe", "beam_jobs"):
                names |= {f"{node.module}.{alias.name}" for alias in node.names}
            else:
                names.add(node.module)
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "tfrecord_pipe"
            and node.attr in tfrecord_pipe.PUBLIC_MODULES
        ):
            names.add(f"tfrecord_pipe.{node.attr}")
    return names


def test_every_module_is_in_a_layer():
    for module, _ in sources():
        if module != "tfrecord_pipe":
            assert layer_of(module) in ALLOWED, f"{module} is in no layer"


@pytest.mark.parametrize("module, path", list(sources()), ids=lambda x: str(x).split("/")[-1])
def test_imports_go_only_down_the_layers(module, path):
    layer = layer_of(module)
    if layer is None:  # tfrecord_pipe/__init__.py: the version, and lazy names of public modules
        assert not [name for name in imported(path) if name.startswith(("tfrecord_pipe", "beam"))]
        return
    wrong = []
    for name in sorted(imported(path)):
        top = name.split(".")[0]
        if top in ("tfrecord_pipe", "beam_jobs"):
            target = layer_of(name.removesuffix(".__version__"))
            if target is not None and target not in ALLOWED[layer]:
                wrong.append(f"{name} (layer {target})")
        elif top in FORBIDDEN[layer] or name.startswith("relative import"):
            wrong.append(name)
    assert not wrong, f"{module} ({layer}) imports {wrong}"


def test_the_check_sees_imports_hidden_in_functions_lazy_names_and_relative_imports(tmp_path):
    path = tmp_path / "m.py"
    path.write_text(
        "import tfrecord_pipe\nfrom . import x\ndef f():\n"
        "    from tfrecord_pipe._reading import reader\n    import tensorflow\n"
        "    return tfrecord_pipe.serving.export\n"
    )
    assert imported(path) == {
        "tfrecord_pipe", "relative import from .", "tfrecord_pipe._reading.reader",
        "tensorflow", "tfrecord_pipe.serving",
    }  # fmt: skip


@pytest.mark.slow
def test_neither_the_core_nor_the_job_loads_tensorflow_and_public_modules_load_when_used():
    # Dataflow workers (and local worker processes) start faster and use less memory without
    # TensorFlow, and `tfrecord-pipe convert` starts in a second instead of four. The Grain
    # path and its example need no TensorFlow (it took 3 s of each start of the example).
    import subprocess
    import sys

    code = (
        "import sys, tfrecord_pipe, tfrecord_pipe._core.schema, tfrecord_pipe._core.manifest;"
        "import tfrecord_pipe.schema, tfrecord_pipe.manifest, tfrecord_pipe.images;"
        "from tfrecord_pipe.schema import ImageRecord; from tfrecord_pipe import manifest;"
        "import beam_jobs.convert, beam_jobs.pipeline, beam_jobs.finalise;"
        "import tfrecord_pipe.grain, examples.grain_loop;"
        "print('tensorflow' in sys.modules);"
        "print(tfrecord_pipe.reader.__name__, tfrecord_pipe.schema.__name__)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "tfrecord_pipe.reader", "tfrecord_pipe.schema"]


def test_the_core_works_with_its_own_dependencies_alone(tmp_path):
    # `pip install tfrecord-pipe` installs Pillow and google-crc32c alone (pyproject.toml),
    # and the core is documented to need no more: it imported numpy (for numpy's bool, in its
    # checks of arguments), and `import tfrecord_pipe.images` failed there. Here the packages
    # of the extras cannot be imported.
    import os
    import subprocess
    import sys

    from helpers import without

    code = """
import io
from PIL import Image
from tfrecord_pipe import images, manifest, schema
jpeg = io.BytesIO()
Image.new("CMYK", (40, 30), (10, 20, 30, 40)).save(jpeg, "JPEG")
stored = images.normalise(jpeg.getvalue())
record = schema.ImageRecord(stored.encoded, stored.height, stored.width, 0, "cat", "a.jpg",
                            "0" * 64)
again = schema.decode_example(schema.serialize(record, label_offset=1), label_offset=1)
print(again == record, again.height, again.width, manifest.parse_labels("cat\\ndog\\n", "x"))
"""
    extras = ("numpy", "tensorflow", "apache_beam", "jax", "grain", "cv2", "array_record")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, **without(tmp_path, *extras)))  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().split(maxsplit=3) == ["True", "30", "40", "('cat', 'dog')"], done.stdout
    # The Grain path there says which extra it needs ("No module named 'numpy'" said nothing).
    done = subprocess.run([sys.executable, "-c", "from tfrecord_pipe import grain"],
                          capture_output=True, text=True,
                          env=dict(os.environ, **without(tmp_path, *extras)))  # fmt: skip
    assert done.returncode == 1 and done.stderr.strip().splitlines()[-1] == (
        "ImportError: The Grain path needs the grain extra: pip install 'tfrecord-pipe[grain]' "
        "(in a clone: pip install -c constraints.txt '.[grain]'; make install installs every "
        "extra)."
    ), done.stderr[-2000:]


def test_no_module_of_the_job_hides_a_library_when_run_as_a_script():
    # The Flex Template runs beam_jobs/convert.py as a script: its folder comes first on
    # sys.path, and a beam_jobs/packaging.py hid the `packaging` that Beam imports.
    import importlib.metadata
    import sys

    installed = {
        name
        for dist in importlib.metadata.distributions()
        for name in (dist.read_text("top_level.txt") or "").split()
    } | {
        pathlib.Path(str(file)).parts[0].removesuffix(".py")
        for dist in importlib.metadata.distributions()
        for file in (dist.files or ())
        if not str(file).startswith(("..", "/"))
    }
    ours = {path.stem for path in (ROOT / "beam_jobs").glob("*.py")} - {"__init__"}
    hidden = ours & (installed | set(sys.stdlib_module_names))
    assert not hidden, f"beam_jobs modules named like installed or standard modules: {hidden}"
