"""Native parts of aserve (see pyproject.toml for why setuptools).

Two artifacts:
- aserve._native: the host extension, compiled against the running interpreter.
- aserve._interp: the library loaded first into every private interpreter's
  link-map namespace. It is linked against the same libpython (DT_NEEDED, with an
  rpath), so that dlmopen brings a private copy of libpython along with it and
  extension modules imported there bind to that copy.
"""

import sysconfig

from setuptools import Extension, setup

common = ["-std=c11", "-D_GNU_SOURCE", "-fvisibility=hidden", "-Wall", "-Wno-missing-field-initializers"]
interp_runtime = ["native/interp/runtime.c", "native/interp/join.c", "native/interp/inputs.c"]

extensions = [
    Extension(
        "aserve._native",
        sources=[
            "native/host/module.c",
            "native/host/pool.c",
            "native/host/pool_join.c",
            "native/host/pool_cancel.c",
            "native/host/pool_coalesce.c",
            "native/host/pool_type.c",
            "native/host/link.c",
            "native/host/link_type.c",
            "native/host/front_queue.c",
            "native/host/counter.c",
            "native/host/plan.c",
            "native/host/plan_join.c",
            "native/host/plan_type.c",
            "native/host/buffer.c",
            "native/host/rows.c",
            "native/host/private.c",
            "native/host/engines.c",
            "native/host/errors.c",
            "native/host/fault.c",
            "native/host/otlp.c",
            "native/host/trace.c",
            "native/host/v2json.c",
            "native/host/v2binary.c",
            "native/host/h2.c",
            "native/host/grpcwire.c",
            *interp_runtime,
        ],
        depends=["native/abi.h", "native/host/common.h", "native/host/pool.h", "native/host/link.h", "native/interp/runtime.h"],
        extra_compile_args=common,
        libraries=["dl", "pthread", "m", "nghttp2"],
    )
]

if sysconfig.get_config_var("Py_ENABLE_SHARED"):
    libdir = sysconfig.get_config_var("LIBDIR")
    ldlibrary = sysconfig.get_config_var("LDLIBRARY")  # e.g. libpython3.11.so
    extensions.append(
        Extension(
            "aserve._interp",
            sources=[*interp_runtime, "native/interp/embed.c", "native/interp/namespace.c"],
            depends=["native/abi.h", "native/interp/runtime.h"],
            extra_compile_args=common,
            libraries=[ldlibrary.removeprefix("lib").split(".so")[0], "dl", "pthread"],
            library_dirs=[libdir],
            runtime_library_dirs=[libdir],
        )
    )

setup(ext_modules=extensions)
