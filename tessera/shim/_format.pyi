# The cffi extension built from shim/build.py (ffibuilder): its `ffi` and `lib` are dynamic.
from typing import Any

ffi: Any
lib: Any
