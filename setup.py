# For pip before 19 (CPython 3.6's own pip is 18.1), which builds a project by
# its setup.py; the metadata is setup.cfg's.
from setuptools import setup

setup()
