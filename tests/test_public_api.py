"""The public API: modules importable in every form, docs/api.md saying exactly what they
export, misspelt options named, help() showing every option, the package typed."""

import ast
import dataclasses
import importlib
import importlib.resources
import pathlib
import pydoc
import re
import subprocess
import sys
import types

import numpy as np
import pytest

import tfrecord_pipe

ROOT = pathlib.Path(__file__).resolve().parents[1]


def documented() -> dict[str, set[str]]:
    """Module name to the names docs/api.md lists for it (the first column of its table)."""
    found, module = {}, None
    for line in (ROOT / "docs" / "api.md").read_text().splitlines():
        heading = re.match(r"## `tfrecord_pipe\.(\w+)`", line)
        if heading:
            module = heading.group(1)
            found[module] = set()
        elif module and line.startswith("| `"):
            found[module] |= set(re.findall(r"`(\w+)`", line.split("|")[1]))
    return found


def test_the_api_page_lists_every_public_module_and_exactly_what_each_exports():
    pages = documented()
    assert set(pages) == set(tfrecord_pipe.PUBLIC_MODULES)
    for name in tfrecord_pipe.PUBLIC_MODULES:
        module = importlib.import_module(f"tfrecord_pipe.{name}")
        assert set(module.__all__) == pages[name], name
        for export in module.__all__:
            assert hasattr(module, export), f"tfrecord_pipe.{name}.{export}"


@pytest.mark.parametrize("name", tfrecord_pipe.PUBLIC_MODULES)
def test_every_import_form_works(name):
    exported = importlib.import_module(f"tfrecord_pipe.{name}").__all__[0]
    namespace = {}
    exec(f"import tfrecord_pipe.{name}", namespace)
    exec(f"from tfrecord_pipe.{name} import {exported}", namespace)
    exec(f"from tfrecord_pipe import {name} as module", namespace)
    assert namespace["module"] is getattr(tfrecord_pipe, name)
    assert getattr(namespace["module"], exported) is namespace[exported]


def test_make_input_fn_names_the_closest_option_for_a_misspelt_one():
    from tfrecord_pipe.reader import ReaderConfig, make_input_fn

    with pytest.raises(TypeError, match=r"'batchsize'; did you mean 'batch_size'\?"):
        make_input_fn("data", is_training=True, batchsize=32)
    with pytest.raises(TypeError, match=r"'hostindex'; did you mean 'host_index'\?"):
        make_input_fn("data", is_training=True, hostindex=0)
    with pytest.raises(TypeError, match=r"'zzz'; the options are: autotune, batch_size"):
        make_input_fn("data", is_training=True, zzz=1)
    with pytest.raises(TypeError, match=r"ReaderConfig\(\) .*'shufle_buffer'; did you mean"):
        ReaderConfig(data="data", shufle_buffer=10)


def test_serving_config_names_the_closest_option_too():
    from tfrecord_pipe.serving import ServingConfig

    with pytest.raises(TypeError, match=r"'imagesize'; did you mean 'image_size'\?"):
        ServingConfig(labels=("a",), imagesize=32)


def test_help_shows_every_reader_option_with_its_default():
    from tfrecord_pipe.reader import ReaderConfig, make_input_fn

    shown = pydoc.render_doc(make_input_fn, renderer=pydoc.plaintext)
    for field in dataclasses.fields(ReaderConfig):
        if field.name not in ("data", "split", "is_training"):
            assert f"{field.name}: " in shown and f"= {field.default!r}" in shown, field.name
    assert "**options" not in shown.splitlines()[2]  # the signature line lists them instead


def test_the_package_is_typed():
    assert importlib.resources.files("tfrecord_pipe").joinpath("py.typed").is_file()


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.py")), ids=lambda p: p.name)
def test_the_examples_use_only_the_public_api(path):
    used, public = set(), {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tfrecord_pipe"):
            assert node.module == "tfrecord_pipe", f"{path.name} imports {node.module}"
            public |= {alias.asname or alias.name: alias.name for alias in node.names}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id in public:
                used.add((public[node.value.id], node.attr))
    assert set(public.values()) <= set(tfrecord_pipe.PUBLIC_MODULES)
    for module, name in used:
        assert name in importlib.import_module(f"tfrecord_pipe.{module}").__all__, (module, name)


def python_snippets(page: pathlib.Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", page.read_text(), re.M | re.S)


DOC_PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("page", [page for page in DOC_PAGES if python_snippets(page)],
                         ids=lambda p: p.name)  # fmt: skip
def test_the_snippets_in_the_docs_parse_and_name_what_exists(page):
    # Users copy them: only the public API.
    public = {"tfrecord_pipe", *(f"tfrecord_pipe.{m}" for m in tfrecord_pipe.PUBLIC_MODULES)}
    for snippet in python_snippets(page):
        tree = ast.parse(snippet)
        imported = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tfrecord_pipe"):
                assert node.module in public, f"{page.name} imports {node.module}"
                module = importlib.import_module(node.module)
                for alias in node.names:
                    if not hasattr(module, alias.name):  # a submodule not imported yet
                        importlib.import_module(f"{node.module}.{alias.name}")
                    imported[alias.asname or alias.name] = getattr(module, alias.name)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                module = imported.get(node.value.id)
                if isinstance(module, types.ModuleType) and module.__name__.startswith("tfrecord_pipe"):
                    assert hasattr(module, node.attr), f"{page.name}: {module.__name__}.{node.attr}"
                    assert node.attr in module.__all__, f"{page.name}: {module.__name__}.{node.attr}"


@pytest.mark.slow
def test_the_readme_snippets_run_as_written(tmp_path):
    # A new user copies them in order (train, Grain, serve) beside the dataset the README's
    # convert command writes, ArrayRecord shards too, as its Grain paragraph says.
    from beam_jobs import convert
    from helpers import IN_PROCESS, encode

    rng = np.random.default_rng(0)
    for label in ("daisy", "rose"):
        (tmp_path / "flowers" / label).mkdir(parents=True)
        for i in range(1, 25):
            pixels = rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)
            (tmp_path / "flowers" / label / f"{i}.jpg").write_bytes(encode(pixels))
    convert.run([str(tmp_path / "flowers"), str(tmp_path / "dataset"), "--validation_fraction",
                 "0.1", "--formats", "tfrecord,array_record", *IN_PROCESS])  # fmt: skip
    script = "\n".join(python_snippets(ROOT / "README.md"))
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] in ("[b'daisy']", "[b'rose']"), done.stdout
    assert "cuInit" not in done.stderr  # held back, as the snippet says
    assert "more than once" not in done.stderr  # its batches fit the tour's 43 images
