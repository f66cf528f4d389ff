"""A compile worker: ``python -m qconv.gpu._build_worker P D`` builds qconv's OpenCL programs for device D of
platform P, one a request, so that the driver's on-disk cache of source builds (NVIDIA's ComputeCache) holds them
for the process that asked.

NVIDIA's OpenCL compiles one program at a time in a process (measured on an H100: 220 builds on 16 threads took as
long as one after another, 0.26 s each), so :func:`qconv.gpu.programs.build_many` hands the tuner's candidates to
a few of these processes and then loads every program from the cache. Protocol, one JSON object a line: a request
``{"program": name, "options": [...]}`` on stdin, the reply ``{"ok": true}`` or ``{"ok": false, "error": text}``
on stdout; the worker exits when its stdin closes (its parent's exit closes it).
"""
from __future__ import annotations

import json
import sys
import warnings


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    import pyopencl as cl

    from .programs import BASE_OPTIONS, source

    device = cl.get_platforms()[int(argv[0])].get_devices()[int(argv[1])]
    ctx = cl.Context([device])
    out = sys.stdout
    print(json.dumps({"ready": True}), file=out, flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cl.Program(ctx, source(req["program"])).build(options=list(BASE_OPTIONS) + list(req["options"]))
            reply = {"ok": True}
        except Exception as exc:  # noqa: BLE001 (the asking process builds it again and raises it there)
            reply = {"ok": False, "error": str(exc)[:2000]}
        print(json.dumps(reply), file=out, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
