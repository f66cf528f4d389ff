"""Build the Cython extensions of qconv.

Every ``qconv/_ext/*.pyx`` becomes ``qconv._ext.<name>``. Threads are the engine's own pool
(``qconv/_ext/qconv_pool.h``, pthreads): no OpenMP. ``QCONV_SANITIZE=1`` adds
``-fsanitize=address,undefined`` (see ``make sanitize``). No ``-march`` flag is ever passed: every SIMD kernel
is compiled through target attributes and picked at run time from CPUID, so one build runs on any x86-64 CPU.
"""
import glob
import os

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup


def _flags():
    compile_args = ["-O3", "-fno-strict-aliasing", "-pthread"]
    link_args = ["-pthread"]
    if os.environ.get("QCONV_SANITIZE"):
        san = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-g", "-O1"]
        compile_args = [a for a in compile_args if a != "-O3"] + san
        link_args += ["-fsanitize=address,undefined"]
    return compile_args, link_args


def _extensions():
    compile_args, link_args = _flags()
    exts = []
    for pyx in sorted(glob.glob(os.path.join("qconv", "_ext", "*.pyx"))):
        name = "qconv._ext." + os.path.splitext(os.path.basename(pyx))[0]
        exts.append(Extension(
            name, [pyx],
            include_dirs=[np.get_include(), os.path.join("qconv", "_ext")],
            depends=sorted(glob.glob(os.path.join("qconv", "_ext", "*.h"))),   # rebuild when a header changes
            define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
            extra_compile_args=compile_args, extra_link_args=link_args,
        ))
    return cythonize(exts, language_level=3, compiler_directives={
        "boundscheck": False, "wraparound": False, "cdivision": True, "initializedcheck": False,
    })


setup(ext_modules=_extensions())
