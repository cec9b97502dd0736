"""Sphinx configuration of the daskkrr documentation.

Build from the repository root (warnings are errors, as in CI)::

    python -m sphinx -W --keep-going -b html docs docs/_build/html
"""

from __future__ import annotations

import sys
from pathlib import Path

# Document the checkout this file belongs to, even when another copy is installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import daskkrr  # noqa: E402

project = "daskkrr"
author = "daskkrr developers"
copyright = "daskkrr developers"  # noqa: A001 (Sphinx's name)
version = release = daskkrr.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "numpydoc",
    "sphinx_gallery.gen_gallery",
]
# No sphinx.ext.intersphinx: CI has no network, and intersphinx downloads inventories.

templates_path = ["_templates"]
exclude_patterns = ["_build"]
root_doc = "index"

# API pages are generated from the packages' __all__: a name is documented where users import it.
autosummary_generate = True
autosummary_ignore_module_all = False
autosummary_imported_members = True
autodoc_default_options = {"members": True, "member-order": "groupwise"}
autodoc_typehints = "none"  # numpydoc's Parameters sections carry the types
autodoc_mock_imports = ["prefect"]

numpydoc_show_class_members = False  # members come from autodoc; avoid a second, partial table
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False

# The tutorial and the example gallery are scripts in workflows/ that run during the build
# (each in seconds, on bundled or generated data); their pages and images are generated
# into docs/tutorial/ and docs/gallery/, which git ignores.
sphinx_gallery_conf = {
    "examples_dirs": ["../workflows/tutorial", "../workflows/gallery"],
    "gallery_dirs": ["tutorial", "gallery"],
    "filename_pattern": r"/plot_",  # run every example (their names start with plot_)
    "within_subsection_order": "FileNameSortKey",
    "download_all_examples": False,
    "remove_config_comments": True,
    "show_memory": False,
    "write_computation_times": False,
    "matplotlib_animations": False,
    "abort_on_example_error": True,  # a failing example fails the build
}

html_theme = "pydata_sphinx_theme"
html_title = f"daskkrr {release}"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
}
html_static_path: list[str] = []


def _skip_member(app, what, name, obj, skip, options):
    """Leave out members inherited from scikit-learn (``get_params``, ``set_output``,
    the generated ``set_fit_request`` ...): their docstrings point into sklearn's own docs."""
    if name.startswith("set_") and name.endswith("_request"):
        return True
    if what == "class" and (getattr(obj, "__module__", None) or "").startswith("sklearn."):
        return True
    return None


def setup(app):
    app.connect("autodoc-skip-member", _skip_member)
