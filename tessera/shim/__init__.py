"""Tessera's enforcement shim: GPU memory and compute limits inside the container.

The shim itself is C (``shim/src``), built into two preload libraries that do not depend on
Python: ``libtessera-cuda.so`` (soname ``libcuda.so.1``) and ``libtessera-nvml.so`` (soname
``libnvidia-ml.so.1``). This package gives Python what it needs around them:

* :mod:`tessera.shim.format` - the limits file and the usage region, read and written through the
  very C code the shim runs (a cffi binding of ``shim/include/tessera_shim.h``);
* :mod:`tessera.shim.install` - where the built libraries are, how to lay them out beside the
  real driver (the alias symlinks) and the environment a process needs to run under them.

docs/shim.md describes the technique, the formats and the limits; docs/threat-model.md what the
shim enforces and what it does not.
"""
