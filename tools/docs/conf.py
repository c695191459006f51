# Sphinx configuration of tierswap's reference documentation. Built by `cmake --build build
# --target docs` (tools/docs/build.sh), which generates the command-line reference and the
# Doxygen XML first and passes where they are through the environment.
import os
import sys

project = "tierswap"
author = "the tierswap authors"
release = os.environ.get("TIERSWAP_VERSION", "")
extensions = ["myst_parser", "breathe", "sphinx.ext.autodoc"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
myst_heading_anchors = 3
html_theme = "furo"
html_title = "tierswap"

# The C++ API: Doxygen's XML of include/tierswap/.
breathe_projects = {"tierswap": os.environ.get("TIERSWAP_DOXYGEN_XML", "doxygen/xml")}
breathe_default_project = "tierswap"
breathe_default_members = ("members",)
# Breathe's C++ domain reports names it meets twice (an overload set, a struct declared in two
# headers' detail namespaces); those are not broken references.
suppress_warnings = ["duplicate_declaration.cpp"]

# tierswap.torch from the build tree (its native module beside it).
sys.path.insert(0, os.environ.get("TIERSWAP_PYTHON_DIR", "."))
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "show-inheritance": True}

linkcheck_anchors = True
