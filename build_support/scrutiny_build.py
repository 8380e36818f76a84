"""scrutiny's PEP 517 build backend: setuptools, after generating the gRPC code from protos/.

The generated modules are not committed (protos/ is the one source): every way of building
(`pip install .`, `pip install -e .`, `python -m build`, the image) passes through here, so a wheel or
an sdist always carries code generated from the protos it was built from.
"""

from __future__ import annotations

from typing import Any

from setuptools import build_meta as _setuptools
from setuptools.build_meta import (  # noqa: F401  (the hooks that need no generated code)
    get_requires_for_build_editable,
    get_requires_for_build_sdist,
    get_requires_for_build_wheel,
    prepare_metadata_for_build_editable,
    prepare_metadata_for_build_wheel,
)

from protogen import generate


def build_wheel(wheel_directory: str, config_settings: dict[str, Any] | None = None,
                metadata_directory: str | None = None) -> str:
    generate()
    return _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_sdist(sdist_directory: str, config_settings: dict[str, Any] | None = None) -> str:
    generate()
    return _setuptools.build_sdist(sdist_directory, config_settings)


def build_editable(wheel_directory: str, config_settings: dict[str, Any] | None = None,
                   metadata_directory: str | None = None) -> str:
    generate()
    return _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)
