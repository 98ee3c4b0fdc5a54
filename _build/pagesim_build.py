"""pagesim's build backend: setuptools' own, plus the opt-in compiled build (``pagesim/engine/compiled.py``).

With ``PAGESIM_COMPILE=1`` in the environment a wheel or editable build also asks for mypy (whose
mypyc compiles the modules ``pagesim/engine/compiled.py`` lists); without it this is setuptools' backend,
unchanged. ``setup.py`` compiles only inside a real build (``build_wheel`` or ``build_editable``,
which set ``_PAGESIM_BUILD_PHASE`` to ``wheel`` or ``editable``), not while setuptools reads
metadata, which it does before the extra requirements are installed; an editable build also
deletes the extension files a previous one left in the source tree.
"""

import os

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F401,F403  (every hook this module does not override)

#: The mypy (mypyc) release the compiled build is made and tested with.
MYPY = "mypy==2.4.1"


def _compiling() -> bool:
    return os.environ.get("PAGESIM_COMPILE", "") not in ("", "0")


def get_requires_for_build_wheel(config_settings=None):
    return _setuptools.get_requires_for_build_wheel(config_settings) + ([MYPY] if _compiling() else [])


def get_requires_for_build_editable(config_settings=None):
    return _setuptools.get_requires_for_build_editable(config_settings) + ([MYPY] if _compiling() else [])


def _in_build(kind, hook, *args):
    os.environ["_PAGESIM_BUILD_PHASE"] = kind
    try:
        return hook(*args)
    finally:
        del os.environ["_PAGESIM_BUILD_PHASE"]


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _in_build("wheel", _setuptools.build_wheel, wheel_directory, config_settings, metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return _in_build("editable", _setuptools.build_editable, wheel_directory, config_settings, metadata_directory)
