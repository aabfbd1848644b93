"""The image tests' fixture; see tests/images/fixtures.py."""

from tests.images.fixtures import images

__all__ = ["images"]
